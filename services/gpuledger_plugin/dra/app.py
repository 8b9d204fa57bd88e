"""Wiring of DRA mode: the API server, the preparer, the DRA socket, the registration socket, ops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from grpclib.server import Server

from gpuledger_common import lifecycle
from gpuledger_common.entry import stop_on_signals
from gpuledger_common.ops import bound_port, ops_app
from gpuledger_common.settings import describe
from gpuledger_common.store.follow import node_ledger
from gpuledger_common.store.ledgerwait import open_ledger
from gpuledger_core.errors import Unavailable
from gpuledger_core.ledger import NodeLedger
from gpuledger_plugin.dra.cdi import Mps
from gpuledger_plugin.dra.claim_check import LedgerEntryCheck
from gpuledger_plugin.dra.health_board import HealthBoard, follow
from gpuledger_plugin.dra.kube import ClaimApi, KubeClaimApi
from gpuledger_plugin.dra.prepare import LedgerCheck, Preparer
from gpuledger_plugin.dra.server import DraHealth, DraPluginV1, DraPluginV1Beta1, Registration
from gpuledger_plugin.dra.settings import DraSettings
from gpuledger_plugin.mig_allocate import MigMaker, NatsMigMaker

log = logging.getLogger(__name__)


LedgerWatch = Callable[[], AsyncGenerator[NodeLedger | None, None]]  # the node's ledger now and on each change


@dataclass(slots=True)
class RunningDra:
    preparer: Preparer
    registration: Registration
    health: HealthBoard
    tasks: asyncio.TaskGroup
    http_port: int = 0
    registrations: int = 0  # how many times the registration socket was (re)created


async def serve(settings: DraSettings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT), then shut down cleanly."""
    stop = stop or stop_on_signals()
    try:
        async with running(settings, stop=stop):
            await stop.wait()
    except Unavailable:
        if not stop.is_set():  # stopped while NATS or the ledger was still away: a clean stop
            raise


@contextlib.asynccontextmanager
async def running(
    settings: DraSettings,
    api: ClaimApi | None = None,
    ledger: LedgerCheck | None = None,
    stop: asyncio.Event | None = None,
    mig: MigMaker | None = None,
    watch: LedgerWatch | None = None,
) -> AsyncIterator[RunningDra]:
    """The DRA plugin, started; every part is stopped, the last started first, however the block
    ends (or a later part fails to start): the registration socket, the ops port, the DRA socket,
    the API server's client, and NATS last. ``api``, ``ledger``, ``mig`` and ``watch`` (of the
    node's ledger): given instead of made (a given ``api`` is closed too)."""
    log.info("gpuledger-plugin (DRA mode) starting with %s", describe(settings))
    async with contextlib.AsyncExitStack() as stack:
        configuration = None if api is not None else await settings.required_kube_configuration("the DRA plugin")
        if ledger is None and settings.ledger_check:
            found_ledger = await _ledger(settings, stack, stop)
            ledger, mig, watch = found_ledger.check, mig or found_ledger.mig, watch or found_ledger.watch
        elif ledger is None:
            log.warning("ledger_check is off: claims are prepared as kube-scheduler allocated them, unchecked")
        if mig is None:
            log.warning("no NATS (ledger_check is off): a claim of a MIG placement is refused at prepare")
        if watch is None:
            log.warning("no ledger to follow: kubelet is told no device's health (it shows Unknown)")
        api = api or KubeClaimApi(configuration, settings.api_timeout_s)
        stack.push_async_callback(api.close)
        found = await _serve(settings, stack, api, ledger, mig)
        if watch is not None:  # the devices' health kept in step with the node's ledger
            lifecycle.background(stack, found.tasks, follow(found.health, watch()))
        stack.callback(log.info, "gpuledger-plugin (DRA mode) stopping")
        yield found
    log.info("gpuledger-plugin (DRA mode) stopped")


@dataclass(frozen=True, slots=True)
class _Ledger:
    """What the plugin has of the node's ledger over NATS."""

    check: LedgerCheck
    mig: MigMaker
    watch: LedgerWatch


async def _ledger(settings: DraSettings, stack: contextlib.AsyncExitStack, stop: asyncio.Event | None) -> _Ledger:
    """The check of each claim against the node's ledger, over NATS (waiting for NATS and the
    ledger's buckets, as the classic plugin does), the node's inventory that makes MIG instances
    and the watch of the node's ledger (its cards' health), over the same connection; NATS
    drained with the stack."""
    nc = await lifecycle.nats_client(stack, settings, f"gpuledger-plugin-dra-{settings.node}", stop)
    if nc is None:
        raise Unavailable("stopped before NATS answered")
    store, node = await open_ledger(nc, stop), settings.node
    return _Ledger(LedgerEntryCheck(store, node), NatsMigMaker(nc, node), lambda: node_ledger(store, node))


async def _serve(
    settings: DraSettings,
    stack: contextlib.AsyncExitStack,
    api: ClaimApi,
    ledger: LedgerCheck | None,
    mig: MigMaker | None = None,
) -> RunningDra:
    """The DRA socket, the ops port and the registration socket, each on ``stack``."""
    mps = Mps(settings.mps_pipe_dir, settings.mps_host_pipe_dir, settings.mps_host_shm_dir)
    preparer = Preparer(
        settings.node,
        settings.driver,
        api,
        settings.cdi_dir,
        ledger,
        settings.prepare_timeout_s,
        mps,
        settings.device_dir,
        mig,
        settings.mig_minors_file,
    )
    board = HealthBoard()
    health = DraHealth(settings.node, board, settings.health_resend_s, settings.health_timeout_s)
    await _serve_socket(stack, Server([DraPluginV1(preparer), DraPluginV1Beta1(preparer), health]), settings.dra_socket)
    log.info("serving DRAPlugin v1 and v1beta1 and DRAResourceHealth v1alpha1 on %s", settings.dra_socket)
    registration = Registration(settings.driver, settings.dra_socket)
    http = await lifecycle.http_site(
        stack, ops_app(lambda: _not_ready(registration)), settings.http_host, settings.http_port
    )
    found = RunningDra(preparer, registration, board, await lifecycle.task_group(stack), bound_port(http))
    lifecycle.background(stack, found.tasks, _keep_registered(settings, registration, found))
    return found


async def _serve_socket(stack: contextlib.AsyncExitStack, server: Server, path: str) -> None:
    """``server`` on the unix socket ``path``; closed, and the socket file removed, with the stack
    (the file is removed even when the server could not start)."""
    stack.callback(_remove, path)
    await _start(server, path)
    stack.push_async_callback(_closed, server)


async def _closed(server: Server) -> None:
    server.close()
    await server.wait_closed()


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
            await _closed(server)
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
