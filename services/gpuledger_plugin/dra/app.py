"""Wiring of DRA mode: the API server, the preparer, the DRA socket, the registration socket, ops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from grpclib.server import Server

from gpuledger_common import bus
from gpuledger_common.entry import stop_on_signals
from gpuledger_common.natscreds import credentials_of
from gpuledger_common.ops import bound_port, ops_app, start_http
from gpuledger_common.settings import describe
from gpuledger_common.store.ledgerwait import open_ledger
from gpuledger_plugin.dra.cdi import Mps
from gpuledger_plugin.dra.kube import ClaimApi, KubeClaimApi
from gpuledger_plugin.dra.ledger import LedgerEntryCheck
from gpuledger_plugin.dra.prepare import LedgerCheck, Preparer
from gpuledger_plugin.dra.server import DraPluginV1, DraPluginV1Beta1, Registration
from gpuledger_plugin.dra.settings import DraSettings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RunningDra:
    preparer: Preparer
    registration: Registration
    http_port: int = 0
    registrations: int = 0  # how many times the registration socket was (re)created


async def serve(settings: DraSettings, stop: asyncio.Event | None = None) -> None:
    stop = stop or stop_on_signals()
    async with running(settings):
        await stop.wait()


@contextlib.asynccontextmanager
async def running(
    settings: DraSettings, api: ClaimApi | None = None, ledger: LedgerCheck | None = None
) -> AsyncIterator[RunningDra]:
    log.info("gpuledger-plugin (DRA mode) starting with %s", describe(settings))
    async with contextlib.AsyncExitStack() as stack:
        if ledger is None and settings.ledger_check:
            ledger = await stack.enter_async_context(_ledger(settings))
        elif ledger is None:
            log.warning("ledger_check is off: claims are prepared as kube-scheduler allocated them, unchecked")
        async with _running(settings, api, ledger) as found:
            yield found


@contextlib.asynccontextmanager
async def _ledger(settings: DraSettings) -> AsyncIterator[LedgerCheck]:
    """The check of each claim against the node's ledger, over NATS (waiting for NATS and the
    ledger's buckets, as the classic plugin does)."""
    nc = await bus.connect(
        settings.nats_url, f"gpuledger-plugin-dra-{settings.node}", credentials=credentials_of(settings)
    )
    try:
        yield LedgerEntryCheck(await open_ledger(nc, None), settings.node)
    finally:
        with contextlib.suppress(Exception):
            await nc.drain()


@contextlib.asynccontextmanager
async def _running(
    settings: DraSettings, api: ClaimApi | None, ledger: LedgerCheck | None
) -> AsyncIterator[RunningDra]:
    api = api or await KubeClaimApi.connect(settings.kubeconfig, settings.api_timeout_s)
    mps = Mps(settings.mps_pipe_dir, settings.mps_host_pipe_dir, settings.mps_host_shm_dir)
    preparer = Preparer(
        settings.node, settings.driver, api, settings.cdi_dir, ledger, settings.prepare_timeout_s, mps
    )
    registration = Registration(settings.driver, settings.dra_socket)
    dra_server = Server([DraPluginV1(preparer), DraPluginV1Beta1(preparer)])
    try:
        await _start(dra_server, settings.dra_socket)
        log.info("serving DRAPlugin v1 and v1beta1 on %s", settings.dra_socket)
        found = RunningDra(preparer, registration)
        http = await start_http(ops_app(lambda: _not_ready(registration)), settings.http_host, settings.http_port)
        found.http_port = bound_port(http)
        keeper = asyncio.create_task(_keep_registered(settings, registration, found))
        try:
            yield found
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await http.cleanup()
    finally:
        dra_server.close()
        await dra_server.wait_closed()
        _remove(settings.dra_socket)
        await api.close()
        log.info("gpuledger-plugin (DRA mode) stopped")


async def _keep_registered(settings: DraSettings, registration: Registration, found: RunningDra) -> None:
    """Serve the registration socket; serve it again whenever it vanishes (kubelet watches the
    directory: a new socket is a new registration)."""
    path = settings.registration_socket
    while True:
        server = Server([registration])
        await _start(server, path)
        found.registrations += 1
        log.info("registration socket %s ready for kubelet", path)
        try:
            while await asyncio.to_thread(os.path.exists, path):
                await asyncio.sleep(settings.socket_poll_s)
            log.warning("registration socket %s vanished: serving it again", path)
            registration.registered.clear()
        finally:
            server.close()
            await server.wait_closed()
            _remove(path)


async def _start(server: Server, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    _remove(path)
    await server.start(path=path)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _not_ready(registration: Registration) -> str:
    return "" if registration.registered.is_set() else "not registered with kubelet"
