"""Wiring: NATS, the node's ledger, placement, PodResources, the inventory (MIG instances), the gRPC
service of each resource and its kubelet registration, ops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from nats.aio.client import Client

from gpuledger_common import bus, lifecycle
from gpuledger_common.entry import stop_on_signals
from gpuledger_common.natscreds import credentials_of
from gpuledger_common.ops import bound_port, ops_app
from gpuledger_common.settings import describe, redact_url
from gpuledger_common.store import LedgerStore
from gpuledger_common.store.ledgerwait import open_ledger
from gpuledger_core.errors import Unavailable
from gpuledger_core.model import Isolation
from gpuledger_plugin.answer import AnswerPolicy
from gpuledger_plugin.kubelet import KubeletLink, Registration
from gpuledger_plugin.ledger_port import StoreLedger
from gpuledger_plugin.mig_allocate import NatsMigMaker
from gpuledger_plugin.mig_resources import ours, socket_name
from gpuledger_plugin.podresources import PodResourcesClient
from gpuledger_plugin.preferred import NatsPreferred
from gpuledger_plugin.server import OPTIONS, DevicePlugin
from gpuledger_plugin.service import PluginService
from gpuledger_plugin.settings import RESOURCE_NAME, PluginSettings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Running:
    """What a running plugin exposes to tests: its parts, once started."""

    service: PluginService
    link: KubeletLink  # gpuledger.io/gpu's
    links: dict[str, KubeletLink]  # every resource's, by name: the gpu resource's and the MIG ones served so far
    http_port: int = 0


async def serve(settings: PluginSettings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT), then shut down cleanly."""
    stop = stop or stop_on_signals()
    try:
        async with running(settings, stop):
            await stop.wait()
    except Unavailable:
        if not stop.is_set():  # stopped while NATS was still away: a clean stop
            raise


@contextlib.asynccontextmanager
async def running(settings: PluginSettings, stop: asyncio.Event | None = None) -> AsyncIterator[Running]:
    """The plugin, started; every part is stopped, the last started first, however the block ends
    (or a later part fails to start): the ops port, the loops (kubelet's link among them), NATS."""
    log.info("gpuledger-plugin starting with %s", describe(settings))
    async with contextlib.AsyncExitStack() as stack:
        nc = await _connect(settings, stop)
        stack.push_async_callback(lifecycle.drain, nc)
        store = await open_ledger(nc, stop, retry_s=settings.ledger_retry_s)
        service = _service(settings, nc, store)
        wake = asyncio.Event()  # reconcile now: set after every registration with kubelet
        link = _link(settings, service, RESOURCE_NAME, wake)
        links = {RESOURCE_NAME: link}
        tasks = await lifecycle.task_group(stack)
        lifecycle.background(stack, tasks, service.follow_ledger())
        lifecycle.background(stack, tasks, service.bind_unbound_forever())
        lifecycle.background(stack, tasks, link.run())
        lifecycle.background(stack, tasks, _serve_mig(settings, service, links, wake, stack, tasks))
        lifecycle.background(stack, tasks, service.reconcile_forever(settings.reconcile_interval_s, wake))
        ops = ops_app(lambda: _not_ready(nc, service, links))
        http = await lifecycle.http_site(stack, ops, settings.http_host, settings.http_port)
        stack.callback(log.info, "gpuledger-plugin stopping")
        yield Running(service, link, links, bound_port(http))
    log.info("gpuledger-plugin stopped")


async def _serve_mig(
    settings: PluginSettings,
    service: PluginService,
    links: dict[str, KubeletLink],
    wake: asyncio.Event,
    stack: contextlib.AsyncExitStack,
    tasks: asyncio.TaskGroup,
) -> None:
    """Serve and register each MIG resource once a card of the node first offers it (its board
    then exists; ``board.MigBoards``); it stays served, its list empty when no card offers it."""
    boards = service.mig_boards
    while True:
        await boards.added.wait()
        boards.added.clear()
        for name in [n for n in boards.boards if n not in links]:
            links[name] = _link(settings, service, name, wake)
            lifecycle.background(stack, tasks, links[name].run())
            log.info("serving %s: a card of node %s in MIG mode offers it", name, settings.node)


def _link(settings: PluginSettings, service: PluginService, resource: str, wake: asyncio.Event) -> KubeletLink:
    handler = DevicePlugin(service, settings.answer_timeout_s, redact_url(settings.nats_url), resource)
    return KubeletLink(_registration(settings, resource), handler, on_registered=wake.set)


def _service(settings: PluginSettings, nc: Client, store: LedgerStore) -> PluginService:
    policy = AnswerPolicy(
        strategies=settings.strategies,
        cdi_kind=settings.cdi_kind,
        device_specs=settings.device_specs,
        device_dir=settings.device_dir,
        default_isolation=Isolation(settings.default_isolation),
        mps_pipe_dir=settings.mps_pipe_dir,
        mps_host_pipe_dir=settings.mps_host_pipe_dir,
        mps_host_shm_dir=settings.mps_host_shm_dir,
        cdi_spec_dirs=settings.cdi_dirs,
    )
    pods = PodResourcesClient(settings.pod_resources_socket, ours, settings.pod_resources_timeout_s)
    placement = NatsPreferred(nc, settings.placement_timeout_s)
    ledger = StoreLedger(store, settings.node)
    return PluginService(
        settings.node,
        ledger,
        placement,
        pods,
        policy,
        settings.slots_per_card,
        gone_after_s=settings.gone_after_s,
        preferred_wait_s=settings.preferred_wait_s,
        allocate_wait_s=settings.allocate_wait_s,
        unreachable_wait_s=settings.unreachable_wait_s,
        maker=NatsMigMaker(nc, settings.node, settings.mig_make_timeout_s),
        mig_minors_file=settings.mig_minors_file,
    )


def _registration(settings: PluginSettings, resource: str) -> Registration:
    socket = f"{settings.device_plugin_dir.rstrip('/')}/{socket_name(settings.socket_name, resource)}"
    return Registration(settings.kubelet_socket, socket, resource, OPTIONS, settings.kubelet_poll_s)


async def _connect(settings: PluginSettings, stop: asyncio.Event | None) -> Client:
    """NATS, retried until it answers: without the ledger there is nothing to advertise."""
    delay = 0.5
    while True:
        try:
            return await bus.connect(
                settings.nats_url,
                f"gpuledger-plugin-{settings.node}",
                stop=stop,
                credentials=credentials_of(settings),
            )
        except Unavailable as err:
            if stop is not None and stop.is_set():
                raise
            log.warning("%s; retrying in %.1fs", err, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await (stop or asyncio.Event()).wait()
            delay = min(delay * 2, 10.0)


def _not_ready(nc: Client, service: PluginService, links: dict[str, KubeletLink]) -> str:
    if not nc.is_connected:
        return "NATS disconnected"
    if service.inventory is None:
        return "the node's cards are not in the ledger yet"
    waiting = sorted(name for name, link in links.items() if not link.registered.is_set())
    if waiting:
        return f"not registered with kubelet: {', '.join(waiting)}"
    return ""
