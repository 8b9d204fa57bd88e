"""Wiring: NATS, the ledger store, the view, the APIs, the sweeper, the tool drains, the reconciler,
the dashboard's trends and the ops endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from grpclib.server import Server
from nats.aio.client import Client

from gpuledger_allocator.api_grpc import AllocatorApi
from gpuledger_allocator.api_history import inventory_asker
from gpuledger_allocator.api_nats import serve_nats
from gpuledger_allocator.dashboard import dashboard_app
from gpuledger_allocator.finder import BuiltinFinder, PlacementFinder
from gpuledger_allocator.ingest import Ingest
from gpuledger_allocator.kube import KubePodLister, PodLister
from gpuledger_allocator.metrics import register as register_metrics
from gpuledger_allocator.metrics import unregister as unregister_metrics
from gpuledger_allocator.overview import Overview
from gpuledger_allocator.podcache import PodCache
from gpuledger_allocator.reconciler import Reconciler
from gpuledger_allocator.service import AllocatorService
from gpuledger_allocator.settings import AllocatorSettings
from gpuledger_allocator.tool_drains import ToolDrains
from gpuledger_allocator.trends import Ring, Trends, sample_every
from gpuledger_allocator.view import ClusterView
from gpuledger_common import lifecycle
from gpuledger_common.entry import stop_on_signals
from gpuledger_common.ops import bound_port, ops_app
from gpuledger_common.settings import describe
from gpuledger_common.store import LedgerStore
from gpuledger_common.tls import server_context

log = logging.getLogger(__name__)


async def serve(settings: AllocatorSettings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT), then shut down cleanly: each part is stopped,
    the last started first, however ``serve`` ends (a stop, a part that fails to start, a cancel)."""
    stop = stop or stop_on_signals()
    log.info("gpuledger-allocator starting with %s", describe(settings))
    async with contextlib.AsyncExitStack() as stack:
        pods = await _pod_lister(settings, stack)
        nc = await lifecycle.nats_client(stack, settings, "gpuledger-allocator", stop)
        if nc is None:
            return
        if await _serve(settings, stack, nc, pods, stop):
            await stop.wait()
        log.info("gpuledger-allocator stopping")
    log.info("gpuledger-allocator stopped")


async def _serve(
    settings: AllocatorSettings,
    stack: contextlib.AsyncExitStack,
    nc: Client,
    pods: PodLister | None,
    stop: asyncio.Event,
) -> bool:
    """Start every part over NATS, each on ``stack``; False when told to stop while the ledger was
    still loading (nothing that answers had started). They stop in reverse: the ops port, gRPC,
    the NATS API and the ingest (no new work), then the work left after answers (``settle``) and
    the placement answers asked ahead, then the loops; NATS is drained after all of them."""
    store = await LedgerStore.open(
        nc,
        replicas=settings.bucket_replicas,
        max_attempts=settings.cas_attempts,
        record_ttls=True,
        retry_s=settings.ledger_retry_s,
        deny_rollups=True,
    )
    view = ClusterView(store, settings.stale_after_s)
    finder = PlacementFinder(
        nc,
        settings.placement_timeout_s,
        settings.placement_retry_s,
        BuiltinFinder(settings.slots_per_card),
        settings.placement_ahead_s,
    )
    service = AllocatorService(
        store,
        view,
        finder,
        settings.lease_s,
        settings.max_lease_s,
        slots_per_card=settings.slots_per_card,
        mix_isolation=settings.mix_isolation,
    )
    tasks = await lifecycle.task_group(stack)
    lifecycle.background(stack, tasks, view.run())
    if not await lifecycle.ready_or_stopped(view.ready, stop):
        log.info("gpuledger-allocator told to stop while the ledger was still loading")
        return False
    lifecycle.background(stack, tasks, _sweep(service, settings.sweep_interval_s))
    drains = ToolDrains(store, view, settings.tool_drain_grace_s)
    lifecycle.background(stack, tasks, drains.run(settings.sweep_interval_s))
    if pods is not None:
        cache = PodCache(pods, settings.reconcile_relist_s)
        reconciler = Reconciler(store, view, pods, cache, settings.reconcile_grace_s)
        lifecycle.background(stack, tasks, cache.run())
        lifecycle.background(stack, tasks, reconciler.run(settings.reconcile_interval_s))
    stack.push_async_callback(finder.stop)
    stack.push_async_callback(service.settle)
    grpc = await _serve_apis(settings, stack, nc, service)
    stack.callback(unregister_metrics, view)
    lifecycle.background(stack, tasks, register_metrics(view).warm())
    overview, trends = Overview(view), _trends(settings)
    lifecycle.background(stack, tasks, sample_every(trends, overview))
    dashboard = dashboard_app(view, inventory_asker(nc), overview, trends)
    ops = ops_app(lambda: "" if nc.is_connected else "NATS disconnected", dashboard)
    http = await lifecycle.http_site(stack, ops, settings.http_host, settings.http_port)
    host, port = settings.grpc_listen_host, _grpc_port(grpc)
    ops_port = bound_port(http)
    log.info("gpuledger-allocator ready: gRPC on %s:%d, http on %s:%d", host, port, settings.http_host, ops_port)
    if not settings.grpc_tls:
        _warn_plaintext(host, port)
    return True


async def _serve_apis(
    settings: AllocatorSettings, stack: contextlib.AsyncExitStack, nc: Client, service: AllocatorService
) -> Server:
    """The ingest of the nodes' inventories, the NATS API and gRPC, each on ``stack``."""
    ingest = Ingest(nc, service.store, service.view)
    stack.push_async_callback(ingest.stop)
    await ingest.start()
    for responder in await serve_nats(nc, service):
        stack.push_async_callback(responder.close)
    grpc = Server([AllocatorApi(service, tls=settings.grpc_tls, admins=settings.admins)])
    await grpc.start(settings.grpc_listen_host, settings.grpc_port, ssl=_grpc_tls(settings))
    stack.push_async_callback(_closed, grpc)
    return grpc


def _trends(settings: AllocatorSettings) -> Trends:
    cluster = Ring(settings.trends_step_s, settings.trends_hours)
    return Trends(cluster, Ring(settings.node_trends_step_s, settings.node_trends_hours))


async def _closed(grpc: Server) -> None:
    grpc.close()
    await grpc.wait_closed()


def _grpc_tls(settings: AllocatorSettings) -> ssl.SSLContext | None:
    if not settings.grpc_tls:
        return None
    return server_context(settings.grpc_cert_file, settings.grpc_key_file, settings.grpc_client_ca_file)


def _warn_plaintext(host: str, port: int) -> None:
    log.warning(
        "gRPC on %s:%d without TLS and without authentication: every caller that reaches it may act on every "
        "allocation (set grpc_cert_file, grpc_key_file and grpc_client_ca_file for mutual TLS)",
        host,
        port,
    )


def _grpc_port(server: Server) -> int:
    sockets = getattr(server._server, "sockets", None) or ()
    port: int = sockets[0].getsockname()[1] if sockets else 0
    return port


async def _sweep(service: AllocatorService, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            tidied = await service.sweep()
            if tidied:
                log.info("expired reservations swept on %d node(s)", tidied)
        except Exception as err:  # NATS away: try again next round
            log.warning("sweep failed: %s", err)


async def _pod_lister(settings: AllocatorSettings, stack: contextlib.AsyncExitStack) -> PodLister | None:
    """Kubernetes access for reconciliation (closed with the stack), or None (no Kubernetes)."""
    configuration = await settings.kube_configuration()
    if configuration is None:
        log.info("the ledger is not reconciled with pods (no Kubernetes access)")
        return None
    pods = KubePodLister(configuration, field_selector=settings.reconcile_field_selector)
    stack.push_async_callback(pods.close)
    return pods
