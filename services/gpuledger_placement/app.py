"""Wiring: NATS, the ledger view, Kubernetes, the extender, the NATS subjects, the ops endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from nats.aio.client import Client

from gpuledger_common import inventory_api, lifecycle
from gpuledger_common.entry import stop_on_signals
from gpuledger_common.inventory_api import MadeMig
from gpuledger_common.ops import bound_port, ops_app
from gpuledger_common.settings import describe, redact_url
from gpuledger_common.store import LedgerStore
from gpuledger_common.store.ledgerwait import open_ledger
from gpuledger_common.store.outage import within
from gpuledger_common.tls import EXTENDER_ALPN, server_context
from gpuledger_core.errors import Unavailable
from gpuledger_core.mig_place import MigAsks
from gpuledger_core.model import MigSlot
from gpuledger_core.packing import WorkloadTracker
from gpuledger_placement.api_nats import serve_nats
from gpuledger_placement.assumed import Assumptions
from gpuledger_placement.auditor import Auditor
from gpuledger_placement.binder import Binder
from gpuledger_placement.claim_allocator import ClaimAllocator
from gpuledger_placement.claim_mig import Make
from gpuledger_placement.claim_preempt_b import ModeBPreemption
from gpuledger_placement.claims import ClaimsController
from gpuledger_placement.drainer import Drainer
from gpuledger_placement.hosts import HostUsage, follow
from gpuledger_placement.http2 import ExtenderServer, Verb
from gpuledger_placement.kube import KubePodApi, NoPodApi, PodApi
from gpuledger_placement.policies import Policies
from gpuledger_placement.preemptor import Preemptor
from gpuledger_placement.repacker import Defrag
from gpuledger_placement.routes import Extender, extender_app, forbidden
from gpuledger_placement.service import PlacementService
from gpuledger_placement.settings import PlacementSettings, parse_guard
from gpuledger_placement.view import FleetView

log = logging.getLogger(__name__)
BUILD_IDLE_S = 0.05  # how often the ranking builder looks for a rebuilt policy to rank under


@dataclass(frozen=True, slots=True)
class Parts:
    view: FleetView
    service: PlacementService
    extender: Extender


def build(
    settings: PlacementSettings,
    store: LedgerStore | None,
    pods: PodApi,
    nc: Client | None,
    hosts: HostUsage | None = None,
) -> Parts:
    """The service's parts over a store (None: a view fed by the caller, as the benchmark does);
    ``hosts``: each node's CPU and memory, for fit, the balance term and the guard (None: untracked)."""
    view = FleetView(
        store,
        settings.stale_after_s,
        slots_per_card=settings.slots_per_card,
        mix_isolation=settings.mix_isolation,
        hosts=hosts.totals if hosts is not None else lambda _: None,
    )
    if hosts is not None:  # the node's CPU and memory are part of its state: fit, the balance term, the guard
        hosts.watch(view.host_changed)
    tracker = WorkloadTracker(window=settings.workload_window)
    mig_asks = MigAsks(window=settings.workload_window)
    policies = Policies(
        tracker, view.card_memory, settings.workload_refresh_s, supply=view.card_models, mig_asks=mig_asks
    )
    guard, ready = parse_guard(settings.guard), _ready(view, nc, settings)
    assumed = Assumptions(settings.assume_ttl_s)
    service = PlacementService(view, policies, settings.policy, guard, ready, assumed=assumed, hosts=hosts)
    binder = None
    if store is not None:
        binder = Binder(store, service, pods, settings.lease_s, schedulers=settings.schedulers, hosts=hosts)
    return Parts(view, service, Extender(service, binder, settings.schedulers))


async def _build_rankings(service: PlacementService, idle_s: float = BUILD_IDLE_S) -> None:
    """Build the rankings of a rebuilt policy a slice at a time, the event loop answering
    requests between slices (from the old rankings until the new ones are done)."""
    while True:
        await asyncio.sleep(0 if service.build_rankings() else idle_s)


async def _seed_workload(parts: Parts) -> None:
    """Once the ledger is loaded, count what it holds as the recent workload."""
    await parts.view.ready.wait()
    allocations = [a for entry in parts.view.entries.values() for a in entry.ledger.allocations]
    counted = parts.service.policies.seed(allocations)
    log.info("workload seeded from the ledger: %d live allocation(s)", counted)


def http_app(settings: PlacementSettings, parts: Parts) -> web.Application:
    """The ops endpoints, with the extender's verbs unless those are served over HTTPS (``https_app``)."""
    ready = parts.service.ready
    return ops_app(ready) if settings.extender_tls else ops_app(ready, _verbs(settings, parts, None))


def https_app(settings: PlacementSettings, parts: Parts) -> web.Application:
    """The extender's verbs alone, for callers holding one of the allowed client certificates."""
    return _verbs(settings, parts, settings.clients)


def _verbs(settings: PlacementSettings, parts: Parts, clients: frozenset[str] | None) -> web.Application:
    app = extender_app(parts.extender, settings.url_prefix, settings.max_body_bytes, clients)
    app.middlewares.append(_one_outage_window(settings.ledger_retry_s))
    return app


def _extender_tls(settings: PlacementSettings) -> ssl.SSLContext:
    return server_context(
        settings.extender_cert_file,
        settings.extender_key_file,
        settings.extender_client_ca_file,
        alpn=EXTENDER_ALPN,
        setting="extender",
    )


def _maker(nc: Client | None) -> Make | None:
    """Mode C's way of having a node's inventory make a MIG instance (``claim_mig``)."""
    if nc is None:
        return None

    async def make(node: str, card: str, slot: MigSlot, holder: str) -> MadeMig:
        return await inventory_api.make_mig(nc, node, card, slot, holder, inventory_api.MAKE_TIMEOUT_S)

    return make


async def _https(settings: PlacementSettings, parts: Parts, stack: contextlib.AsyncExitStack) -> ExtenderServer:
    """The verbs on the HTTPS port: over HTTP/2 for kube-scheduler, HTTP/1.1 for other clients."""
    verbs = {
        path: _in_window(verb, settings.ledger_retry_s)
        for path, verb in parts.extender.verbs(settings.url_prefix).items()
    }
    clients = settings.clients
    server = ExtenderServer(
        https_app(settings, parts), verbs, lambda caller: forbidden(caller, clients), settings.max_body_bytes
    )
    stack.push_async_callback(server.close, settings.stop_timeout_s)
    await server.start(settings.listen_host, settings.extender_port, _extender_tls(settings))
    return server


def _in_window(verb: Verb, seconds: float) -> Verb:
    """A verb over HTTP/2 in its own outage window, as ``_one_outage_window`` does over HTTP/1.1."""

    async def answer(body: bytes, caller: str) -> web.Response:
        with within(seconds):
            return await verb(body, caller)

    return answer


def _one_outage_window(seconds: float) -> Middleware:
    """The ledger reads and writes of one request (a bind's) share one outage window."""

    @web.middleware
    async def within_window(request: web.Request, handler: Handler) -> web.StreamResponse:
        with within(seconds):
            return await handler(request)

    return within_window


async def serve(settings: PlacementSettings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT), then shut down cleanly: each part is stopped,
    the last started first, however ``serve`` ends (a stop, a part that fails to start, a cancel)."""
    stop = stop or stop_on_signals()
    log.info("gpuledger-placement starting with %s", describe(settings))
    async with contextlib.AsyncExitStack() as stack:
        pods = await _pod_api(settings, stack)
        nc = await lifecycle.nats_client(stack, settings, "gpuledger-placement", stop, settings.stop_timeout_s)
        if nc is None:
            return
        store = await _ledger(settings, nc, stop)
        if store is None:
            return
        await _serve(settings, stack, nc, store, pods)
        await stop.wait()
        log.info("gpuledger-placement stopping")
    log.info("gpuledger-placement stopped")


async def _ledger(settings: PlacementSettings, nc: Client, stop: asyncio.Event) -> LedgerStore | None:
    """The ledger's buckets, waited for; None when told to stop first."""
    try:
        return await open_ledger(nc, stop, retry_s=settings.ledger_retry_s)
    except Unavailable:
        if not stop.is_set():
            raise
        log.info("gpuledger-placement stopped before the ledger opened")
        return None


async def _serve(
    settings: PlacementSettings, stack: contextlib.AsyncExitStack, nc: Client, store: LedgerStore, pods: PodApi
) -> None:
    """Start every part, each on ``stack``. They stop in reverse: the extender (HTTPS, then HTTP
    with the ops endpoints), the NATS subjects, the heartbeats, then the loops; then NATS is
    drained, and Kubernetes' client closed."""
    hosts = _hosts(settings, pods)
    parts = build(settings, store, pods, nc, hosts)
    tasks = await lifecycle.task_group(stack)
    lifecycle.background(stack, tasks, parts.view.run())
    lifecycle.background(stack, tasks, _seed_workload(parts))
    parts.service.build_step = 0  # rankings under a rebuilt policy are built between requests
    lifecycle.background(stack, tasks, _build_rankings(parts.service))
    if isinstance(pods, KubePodApi):
        if hosts is not None:
            lifecycle.background(stack, tasks, follow(pods, hosts))
        preemptor = None
        if (settings.preemption == "on" or settings.defrag == "on") and store is not None:
            preemptor = Preemptor(pods, store, parts.service, hold_s=settings.preemption_hold_s)
            preemptor.preempting = settings.preemption == "on"
            if settings.defrag == "on":
                preemptor.defrag = Defrag(
                    settings.defrag_max_moves, settings.defrag_moves_per_hour, settings.defrag_cooldown_s
                )
            parts.extender.preemptor = preemptor
            stack.push_async_callback(preemptor.stop)
        if settings.drain == "on":  # the holders of a card whose remedy is drain are evicted
            lifecycle.background(stack, tasks, Drainer(pods, parts.view).run())
        auditor = Auditor(pods, parts.view, settings.over_grant_action, settings.over_grant_grace_s)
        lifecycle.background(stack, tasks, auditor.run())  # pods over their grants: told, or evicted
        stack.push_async_callback((await auditor.listen(nc)).unsubscribe)
        if settings.dra_claims != "off":  # the ledger decides DRA allocations
            claims = ClaimsController(pods, store, parts.view, memory_step_mib=settings.dra_memory_step_mib)
            claims.make = _maker(nc)  # a claim's MIG instances made before it is allocated (C) or committed (B)
            lifecycle.background(stack, tasks, claims.run(optional=settings.dra_claims == "auto"))
            mode_b = None
            if preemptor is not None and settings.preemption == "on":  # kube-scheduler's claims: preempted for
                mode_b = ModeBPreemption(pods, claims, parts.view, parts.service.current_policy,
                                         preemptor.consider_claim, hosts)  # fmt: skip
            if settings.dra_allocation == "on":  # mode C: the ledger allocates the claims of gated pods
                allocator = ClaimAllocator(pods, claims, parts.view, parts.service.current_policy, hosts)
                policies = parts.service.policies  # claims weigh in the workload and are placed by it, as pods
                allocator.chooser, allocator.observe = policies.mig_chooser, policies.observe
                allocator.preferred = parts.service.best_nodes  # ranked as classic pods, not scored per claim
                allocator.rng = parts.service.rng  # and drawn as they are, under the random policy
                allocator.preempt = preemptor.consider_claim if preemptor is not None else None
                if mode_b is not None:  # one watch of unscheduled pods serves both
                    allocator.refused = mode_b.offer
                lifecycle.background(stack, tasks, allocator.run())
            elif mode_b is not None:
                lifecycle.background(stack, tasks, mode_b.run())
    stack.push_async_callback(parts.view.stop_listening)
    await parts.view.listen(nc)
    for responder in await serve_nats(nc, parts.service, settings.nats_queue):
        stack.push_async_callback(responder.close, settings.stop_timeout_s)
    runner = await lifecycle.http_site(stack, http_app(settings, parts), settings.listen_host, settings.http_port)
    https = await _https(settings, parts, stack) if settings.extender_tls else None
    log.info(
        "gpuledger-placement ready: extender on %s://%s:%d%s, ops endpoints on port %d, policy %s",
        "https" if https is not None else "http",
        settings.listen_host,
        https.port if https is not None else bound_port(runner),
        settings.url_prefix,
        bound_port(runner),
        settings.policy,
    )
    if https is None:
        _warn_plaintext(settings.listen_host, bound_port(runner))


def _hosts(settings: PlacementSettings, pods: PodApi) -> HostUsage | None:
    """Each node's CPU and memory, followed wherever Kubernetes is reached: fit, the balance term of
    ``default`` and the guard use them. None without Kubernetes access (untracked)."""
    if isinstance(pods, KubePodApi):
        return HostUsage()
    if settings.guard != "off":
        log.warning("guard %s set, but without Kubernetes access it cannot know nodes' CPU and memory", settings.guard)
    return None


def _warn_plaintext(host: str, port: int) -> None:
    log.warning(
        "the extender on %s:%d takes plain HTTP without authentication: whoever reaches it can bind pods "
        "(set extender_cert_file, extender_key_file and extender_client_ca_file)",
        host,
        port,
    )


def _ready(view: FleetView, nc: Client | None, settings: PlacementSettings) -> Callable[[], str]:
    def check() -> str:
        if nc is not None and not nc.is_connected:
            return f"the ledger is unreachable: NATS at {redact_url(settings.nats_url)} is disconnected"
        if nc is not None and not view.ready.is_set():
            return "the ledger view is still loading"
        return ""

    return check


async def _pod_api(settings: PlacementSettings, stack: contextlib.AsyncExitStack) -> PodApi:
    """Pods through Kubernetes (closed with the stack), or ``NoPodApi`` without Kubernetes: bind
    then fails with a clear error. ``dra_claims=on`` needs Kubernetes."""
    if settings.dra_claims == "on":
        configuration = await settings.required_kube_configuration("dra_claims=on (the claims controller)")
    else:
        configuration = await settings.kube_configuration()
    if configuration is None:
        level = logging.INFO if settings.kube == "off" else logging.WARNING  # auto found none
        log.log(level, "no Kubernetes access (kube=%s): filter and prioritize only, bind will fail", settings.kube)
        return NoPodApi()
    pods = KubePodApi(configuration, settings.kube_timeout_s)
    stack.push_async_callback(pods.close)
    return pods
