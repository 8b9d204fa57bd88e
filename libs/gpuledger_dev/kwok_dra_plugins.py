"""kubelet's plugin watcher and DRA plugin clients for the kwok kubelet's DRA side.

The registration directory is looked at every ``poll_s`` (kubelet uses fsnotify; the effect is
the same): every unix socket whose name does not start with ``.`` is dialled, asked ``GetInfo``
(1 s, as kubelet), and, if its type is ``DRAPlugin`` and one of its supported services is one
kubelet knows (the first such, in the plugin's order), registered under its name and told so with
``NotifyRegistrationStatus(true)``; otherwise told why with ``plugin_registered=false``. A socket
that failed is tried again every ``retry_s``; a socket that vanishes (or is replaced: another
inode) deregisters its plugin. Calls to a plugin go over one channel to its endpoint with
kubelet's per-call timeout (45 s), through v1 or v1beta1 as chosen.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.exceptions import ProtocolError, StreamTerminatedError

from gpuledger_dev.fake_kubelet import rpc_error
from gpuledger_dev.kwok_dra_claims import PLUGIN_TYPE, V1, PreparedDevice, PrepareError, choose_service
from gpuledger_proto import pluginregistration as reg
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1 as dra
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_beta

log = logging.getLogger(__name__)

RPC_FAILED = (GRPCError, StreamTerminatedError, ProtocolError, OSError, TimeoutError)


@dataclass(frozen=True, slots=True)
class KwokDraSettings:
    """Where the node's DRA plugins register and write their CDI specs, and kubelet's deadlines."""

    registry_dir: str
    cdi_dir: str
    rpc_timeout_s: float = 45.0  # NodePrepareResources / NodeUnprepareResources (kubelet: 45 s)
    register_timeout_s: float = 1.0  # GetInfo and NotifyRegistrationStatus (kubelet: 1 s)
    poll_s: float = 0.1  # the registration directory is looked at this often
    retry_s: float = 1.0  # a socket whose registration failed is tried again after this
    wipe_slices: bool = False  # delete the node's ResourceSlices as kubelet does: at every start, and
    wipe_delay_s: float = 30.0  # a driver's this long after its plugin went (unless it came back)

    def __post_init__(self) -> None:
        for name in ("registry_dir", "cdi_dir"):
            if not os.path.isabs(getattr(self, name)):
                raise ValueError(f"KwokDraSettings: {name} must be an absolute path")
        if min(self.rpc_timeout_s, self.register_timeout_s, self.poll_s, self.retry_s, self.wipe_delay_s) <= 0:
            raise ValueError("KwokDraSettings: timeouts and intervals must be > 0")


@dataclass(frozen=True, slots=True)
class Answer:
    """One claim's part of a plugin's answer."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class DraPlugin:
    """A registered plugin: its driver name, endpoint, the service kubelet chose, one channel."""

    def __init__(self, driver: str, endpoint: str, service: str, socket: str, timeout_s: float) -> None:
        self.driver, self.endpoint, self.service, self.socket = driver, endpoint, service, socket
        self.timeout_s = timeout_s
        self._channel = Channel(path=endpoint)

    def close(self) -> None:
        self._channel.close()

    async def prepare(self, claims: Sequence[tuple[str, str, str]]) -> dict[str, Answer]:
        """NodePrepareResources for (namespace, uid, name) claims: claim UID -> answer."""
        try:
            if self.service == V1:
                request = dra.NodePrepareResourcesRequest(claims=[dra.Claim(ns, uid, name) for ns, uid, name in claims])
                v1 = await dra.DraPluginStub(self._channel).node_prepare_resources(request, timeout=self.timeout_s)
                return {uid: Answer(tuple(map(_device, a.devices)), a.error) for uid, a in v1.claims.items()}
            old = dra_beta.NodePrepareResourcesRequest(claims=[dra_beta.Claim(*c) for c in claims])
            beta = await dra_beta.DraPluginStub(self._channel).node_prepare_resources(old, timeout=self.timeout_s)
            return {uid: Answer(tuple(map(_device, a.devices)), a.error) for uid, a in beta.claims.items()}
        except RPC_FAILED as err:
            raise PrepareError(f"NodePrepareResources: {rpc_error(err)}") from err

    async def unprepare(self, claims: Sequence[tuple[str, str, str]]) -> dict[str, str]:
        """NodeUnprepareResources: claim UID -> error ("" when done)."""
        try:
            if self.service == V1:
                request = dra.NodeUnprepareResourcesRequest(claims=[dra.Claim(*c) for c in claims])
                v1 = await dra.DraPluginStub(self._channel).node_unprepare_resources(request, timeout=self.timeout_s)
                return {uid: a.error for uid, a in v1.claims.items()}
            old = dra_beta.NodeUnprepareResourcesRequest(claims=[dra_beta.Claim(*c) for c in claims])
            beta = await dra_beta.DraPluginStub(self._channel).node_unprepare_resources(old, timeout=self.timeout_s)
            return {uid: a.error for uid, a in beta.claims.items()}
        except RPC_FAILED as err:
            raise PrepareError(f"NodeUnprepareResources: {rpc_error(err)}") from err


def _device(device: dra.Device | dra_beta.Device) -> PreparedDevice:
    share = getattr(device, "share_id", None)
    return PreparedDevice(
        tuple(device.request_names), device.pool_name, device.device_name, tuple(device.cdi_device_ids), share or None
    )


class PluginWatcher:
    """The registration directory's sockets -> registered plugins (``plugins``, by driver name)."""

    def __init__(
        self,
        settings: KwokDraSettings,
        changed: Callable[[], None],
        moved: Callable[[str, bool], None] = lambda driver, registered: None,
    ) -> None:
        """``changed()`` after anything changed; ``moved(driver, registered)`` when a driver's
        plugin registered or deregistered (not when ``forget`` forgets them all)."""
        self.settings, self._changed, self._moved = settings, changed, moved
        self.plugins: dict[str, DraPlugin] = {}
        self.registrations = 0  # successful registrations, all runs together
        self.refusals: list[str] = []  # why a registration was refused, in order
        self._seen: dict[str, int] = {}  # socket path -> inode, registered or given up for now
        self._failed: dict[str, float] = {}  # socket path -> when to try again

    def forget(self) -> None:
        """kubelet restarted: nothing is registered until the sockets are found again."""
        for plugin in self.plugins.values():
            plugin.close()
        self.plugins.clear()
        self._seen.clear()
        self._failed.clear()
        self._changed()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            found = await asyncio.to_thread(_sockets, self.settings.registry_dir)
            for path in [p for p, ino in self._seen.items() if found.get(p) != ino]:
                self._gone(path)
            for path in set(self._failed) - set(found):
                del self._failed[path]
            for path, ino in found.items():
                if path not in self._seen and loop.time() >= self._failed.get(path, 0.0):
                    await self._register(path, ino)
            await asyncio.sleep(self.settings.poll_s)

    def _gone(self, path: str) -> None:
        self._seen.pop(path, None)
        for driver, plugin in list(self.plugins.items()):
            if plugin.socket == path:
                log.info("DRA plugin %s deregistered: %s is gone", driver, path)
                plugin.close()
                del self.plugins[driver]
                self._moved(driver, False)
                self._changed()

    async def _register(self, path: str, ino: int) -> None:
        timeout = self.settings.register_timeout_s
        channel = Channel(path=path)
        try:
            stub = reg.RegistrationStub(channel)
            info = await stub.get_info(reg.InfoRequest(), timeout=timeout)
            refusal = _refusal(info, path)
            if refusal:
                self.refusals.append(refusal)
                log.warning("%s", refusal)
                await stub.notify_registration_status(reg.RegistrationStatus(False, refusal), timeout=timeout)
                self._retry_later(path)
                return
            endpoint = info.endpoint or path
            service = choose_service(info.supported_versions)
            plugin = DraPlugin(info.name, endpoint, service, path, self.settings.rpc_timeout_s)
            old = self.plugins.get(info.name)
            if old is not None:
                old.close()
            self.plugins[info.name] = plugin
            try:
                await stub.notify_registration_status(reg.RegistrationStatus(plugin_registered=True), timeout=timeout)
            except RPC_FAILED:
                plugin.close()
                del self.plugins[info.name]
                raise
        except RPC_FAILED as err:
            log.info("registering the plugin at %s failed, will retry: %s", path, rpc_error(err))
            self._retry_later(path)
            return
        finally:
            channel.close()
        self._seen[path] = ino
        self._failed.pop(path, None)
        self.registrations += 1
        log.info("DRA plugin %s registered (%s at %s)", info.name, plugin.service, endpoint)
        self._moved(info.name, True)
        self._changed()

    def _retry_later(self, path: str) -> None:
        self._failed[path] = asyncio.get_running_loop().time() + self.settings.retry_s


def _refusal(info: reg.PluginInfo, path: str) -> str:
    if info.type != PLUGIN_TYPE:
        return f"RegisterPlugin error -- no handler registered for plugin type: {info.type} at socket {path}"
    try:
        choose_service(info.supported_versions)
    except ValueError as err:
        return f"RegisterPlugin error -- plugin validation failed with err: {err}"
    return ""


def _sockets(directory: str) -> dict[str, int]:
    """Every unix socket under ``directory`` not named ``.*``: path -> inode."""
    found: dict[str, int] = {}
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            path = os.path.join(root, name)
            try:
                status = os.stat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(status.st_mode):
                found[path] = status.st_ino
    return found
