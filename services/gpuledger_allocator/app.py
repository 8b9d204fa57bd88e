"""Wiring: NATS, the ledger store, the view, the APIs, the sweeper, the reconciler and the ops endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from grpclib.server import Server

from gpuledger_allocator.api_grpc import AllocatorApi
from gpuledger_allocator.api_nats import serve_nats
from gpuledger_allocator.dashboard import dashboard_app
from gpuledger_allocator.ingest import Ingest
from gpuledger_allocator.kube import KubePodLister, PodLister, in_cluster
from gpuledger_allocator.metrics import register as register_metrics
from gpuledger_allocator.metrics import unregister as unregister_metrics
from gpuledger_allocator.placer import BuiltinPlacer, NatsPlacer
from gpuledger_allocator.podcache import PodCache
from gpuledger_allocator.reconciler import Reconciler
from gpuledger_allocator.service import AllocatorService
from gpuledger_allocator.settings import AllocatorSettings
from gpuledger_allocator.view import ClusterView
from gpuledger_common import bus
from gpuledger_common.entry import stop_on_signals
from gpuledger_common.natscreds import credentials_of
from gpuledger_common.ops import bound_port, ops_app, start_http
from gpuledger_common.settings import describe
from gpuledger_common.store import LedgerStore
from gpuledger_common.tls import server_context
from gpuledger_core.errors import GpuledgerError, Unavailable

log = logging.getLogger(__name__)


async def serve(settings: AllocatorSettings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT), then shut down cleanly."""
    stop = stop or stop_on_signals()
    log.info("gpuledger-allocator starting with %s", describe(settings))
    pods = await _pod_lister(settings)
    try:
        nc = await bus.connect(
            settings.nats_url,
            "gpuledger-allocator",
            stop=stop,
            credentials=credentials_of(settings),
        )
    except Unavailable:
        if pods is not None:
            await pods.close()
        if stop.is_set():  # told to stop while waiting for NATS
            log.info("gpuledger-allocator stopped before NATS answered")
            return
        raise
    try:
        store = await LedgerStore.open(
            nc,
            replicas=settings.bucket_replicas,
            max_attempts=settings.cas_attempts,
            record_ttls=True,
            retry_s=settings.ledger_retry_s,
            deny_rollups=True,
        )
        view = ClusterView(store, settings.stale_after_s)
        fallback = BuiltinPlacer(settings.slots_per_card)
        placer = NatsPlacer(
            nc, settings.placement_timeout_s, settings.placement_retry_s, fallback, settings.placement_ahead_s
        )
        service = AllocatorService(
            store,
            view,
            placer,
            settings.lease_s,
            settings.max_lease_s,
            slots_per_card=settings.slots_per_card,
            mix_isolation=settings.mix_isolation,
        )
        async with asyncio.TaskGroup() as tasks:
            watching = tasks.create_task(view.run())
            await view.ready.wait()
            sweeping = tasks.create_task(_sweep(service, settings.sweep_interval_s))
            reconciling: list[asyncio.Task[None]] = []
            if pods is not None:
                cache = PodCache(pods, settings.reconcile_relist_s)
                reconciler = Reconciler(store, view, pods, cache, settings.reconcile_grace_s)
                reconciling += [
                    tasks.create_task(cache.run()),
                    tasks.create_task(reconciler.run(settings.reconcile_interval_s)),
                ]
            ingest = Ingest(nc, store, view)
            await ingest.start()
            responders = await serve_nats(nc, service)
            grpc = Server([AllocatorApi(service, tls=settings.grpc_tls, admins=settings.admins)])
            await grpc.start(settings.grpc_listen_host, settings.grpc_port, ssl=_grpc_tls(settings))
            warming = tasks.create_task(register_metrics(view).warm())
            http = await start_http(
                ops_app(lambda: "" if nc.is_connected else "NATS disconnected", dashboard_app(view)),
                settings.http_host,
                settings.http_port,
            )
            log.info(
                "gpuledger-allocator ready: gRPC on %s:%d, http on %s:%d",
                settings.grpc_listen_host,
                _grpc_port(grpc),
                settings.http_host,
                bound_port(http),
            )
            if not settings.grpc_tls:
                _warn_plaintext(settings.grpc_listen_host, _grpc_port(grpc))
            await stop.wait()
            log.info("gpuledger-allocator stopping")
            await ingest.stop()
            for responder in responders:
                await responder.close()
            grpc.close()
            await grpc.wait_closed()
            await service.settle()
            await placer.stop()
            await http.cleanup()
            unregister_metrics(view)
            watching.cancel()
            sweeping.cancel()
            warming.cancel()
            for task in reconciling:
                task.cancel()
    finally:
        with contextlib.suppress(Exception):
            await nc.drain()
        if pods is not None:
            await pods.close()
    log.info("gpuledger-allocator stopped")


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


async def _pod_lister(settings: AllocatorSettings) -> PodLister | None:
    """Kubernetes access for reconciliation, or None (kube=off, or auto with nothing to use)."""
    use_cluster = settings.kube == "in-cluster" or (settings.kube == "auto" and in_cluster())
    use_config = settings.kube == "kubeconfig" or (settings.kube == "auto" and bool(settings.kubeconfig))
    if not (use_cluster or use_config):
        log.info("no Kubernetes access (kube=%s): the ledger is not reconciled with pods", settings.kube)
        return None
    try:
        return await KubePodLister.connect(use_cluster, settings.kubeconfig, settings.reconcile_field_selector)
    except GpuledgerError as err:
        if settings.kube != "auto":
            raise
        log.warning("no Kubernetes access (%s): the ledger is not reconciled with pods", err)
        return None
