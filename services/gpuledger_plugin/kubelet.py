"""Serving the plugin socket and registering with kubelet, again after every kubelet restart.

Order matters: serve the socket first, then Register, because kubelet dials the plugin back inside
Register. A kubelet restart deletes every socket in the device-plugin directory (ours too) and
recreates ``kubelet.sock``; a short poll of both files notices and starts over. Everything the
plugin knows lives in the service, not in the server, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from grpclib.client import Channel
from grpclib.server import Server

from gpuledger_plugin.metrics import REGISTRATIONS
from gpuledger_proto import v1beta1 as dp

log = logging.getLogger(__name__)

VERSION = "v1beta1"
REGISTER_TIMEOUT_S = 15.0  # kubelet dials back with its own 10 s limit inside Register
# From Python 3.12 asyncio's Server.wait_closed also waits for every client connection to end, and
# kubelet keeps its connection to the old socket until we register again: past this, go on.
CLOSE_WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class Registration:
    kubelet_socket: str
    plugin_socket: str
    resource_name: str
    options: dp.DevicePluginOptions
    poll_s: float = 1.0


class KubeletLink:
    def __init__(
        self,
        registration: Registration,
        handler: dp.DevicePluginBase,
        on_registered: Callable[[], None] | None = None,
    ) -> None:
        self.registration, self.handler, self.on_registered = registration, handler, on_registered
        self.registered = asyncio.Event()
        self.restarts = 0  # how many times kubelet was seen to restart

    async def run(self) -> None:
        """Serve and register until cancelled; start over whenever kubelet restarts."""
        while True:
            server = await self._serve()
            try:
                if await self._register_while_served():
                    self.registered.set()
                    if self.on_registered is not None:
                        self.on_registered()
                    await self._until_restart()
                    self.restarts += 1
                    log.info("kubelet restarted (or our socket vanished): serving and registering again")
            finally:
                self.registered.clear()
                server.close()
                _remove(self.registration.plugin_socket)  # before any wait: gone even if that is cut short
                await _closed(server)

    async def _serve(self) -> Server:
        path = self.registration.plugin_socket
        _remove(path)
        server = Server([self.handler])
        await server.start(path=path)
        log.info("serving the device plugin on %s", path)
        return server

    async def _register_while_served(self) -> bool:
        """Register, retrying while kubelet is away; False if our socket vanished meanwhile."""
        delay = self.registration.poll_s
        while _identity(self.registration.plugin_socket) is not None:
            try:
                await self._register()
            except Exception as err:
                REGISTRATIONS.labels("failed").inc()
                log.warning(
                    "registering with kubelet at %s failed: %s",
                    self.registration.kubelet_socket,
                    err,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            REGISTRATIONS.labels("ok").inc()
            log.info("registered %s with kubelet", self.registration.resource_name)
            return True
        return False

    async def _register(self) -> None:
        reg = self.registration
        channel = Channel(path=reg.kubelet_socket)
        try:
            request = dp.RegisterRequest(
                version=VERSION,
                endpoint=os.path.basename(reg.plugin_socket),
                resource_name=reg.resource_name,
                options=reg.options,
            )
            await dp.RegistrationStub(channel).register(request, timeout=REGISTER_TIMEOUT_S)
        finally:
            channel.close()

    async def _until_restart(self) -> None:
        """Return when kubelet.sock is recreated or our own socket is deleted."""
        reg = self.registration
        kubelet = _identity(reg.kubelet_socket)
        while True:
            await asyncio.sleep(reg.poll_s)
            mine = _identity(reg.plugin_socket) is not None
            now = _identity(reg.kubelet_socket)
            if not mine or (now is not None and now != kubelet):
                return
            if now is None:
                log.info("kubelet.sock is gone; waiting for kubelet to come back")
                kubelet = None


async def _closed(server: Server) -> None:
    """Wait for the closed server's request handlers, but not past CLOSE_WAIT_S for kubelet's connection."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await server.wait_closed()


def _identity(path: str) -> tuple[int, int, int] | None:
    """Which file is at ``path`` now (inode numbers are reused, so the change time too)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
