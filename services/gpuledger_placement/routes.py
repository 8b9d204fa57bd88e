"""The kube-scheduler extender over HTTP: ``POST <prefix>/filter``, ``/prioritize``, ``/bind``.

Every verb answers 200 with the extender's JSON unless the request itself is malformed (400 with a
message) or too large (413). Failures the scheduler should see go in the reply's ``Error`` (filter,
bind); prioritize has no error field, so it answers 503, which the scheduler logs and ignores.
Filter passes no node for a pod whose ``schedulerName`` is not one of ours (bind refuses it too).

Over HTTPS (``extender_app`` with ``clients``), a caller must present a client certificate signed
by the extender's client CA (refused in the handshake otherwise) whose common name is one of
``clients`` (403 otherwise). Each verb is a function of the request's body and its caller's
identity (``Extender.verbs``), so the same verbs serve HTTP/1.1 (aiohttp, these routes) and HTTP/2
(``http2.py``). The identity is the client certificate's common name, '' over plain HTTP: a bind
takes the pod as filter read it only from the caller whose filter sent it (``binder.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware

from gpuledger_common.tls import identity_of
from gpuledger_core.errors import GpuledgerError, InvalidArgument
from gpuledger_placement import convert, metrics
from gpuledger_placement.binder import Binder
from gpuledger_placement.convert import BadRequest
from gpuledger_placement.preemptor import Preemptor
from gpuledger_placement.service import Filtered, PlacementService

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Verb = Callable[[bytes, str], Awaitable[web.Response]]  # a verb's answer to a body from a caller


def _reply(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _bad(err: InvalidArgument) -> web.Response:
    return web.Response(status=400, text=f"bad request: {err}\n")


def _timed(verb: str, answer: Verb) -> Verb:
    histogram = metrics.EXTENDER_SECONDS.labels(verb)

    async def timed(body: bytes, caller: str) -> web.Response:
        started = time.perf_counter()
        try:
            return await answer(body, caller)
        finally:
            histogram.observe(time.perf_counter() - started)

    return timed


def _of_request(verb: Verb) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await verb(await request.read(), caller_of(request))

    return handle


def caller_of(request: web.Request) -> str:
    """The caller's verified client certificate's common name ('' over plain HTTP)."""
    return identity_of(request.transport.get_extra_info("peercert") if request.transport else None)


def forbidden(caller: str, clients: frozenset[str]) -> web.Response | None:
    """The 403 for a caller whose client certificate names none of ``clients`` (None: let in)."""
    if caller in clients:
        return None
    metrics.FAILURES.labels("extender", "forbidden").inc()
    log.warning("extender call from %r refused: not one of %s", caller, ", ".join(sorted(clients)))
    return web.Response(status=403, text=f"forbidden: client {caller!r} may not call the extender\n")


class Extender:
    def __init__(
        self,
        service: PlacementService,
        binder: Binder | None,
        schedulers: frozenset[str] = frozenset({"gpuledger-scheduler"}),
    ) -> None:
        self.service, self.binder, self.schedulers = service, binder, schedulers
        self.preemptor: Preemptor | None = None  # set where placement may evict (Kubernetes, the ledger)

    def verbs(self, prefix: str) -> dict[str, Verb]:
        """Each verb by its path, timed."""
        return {
            f"{prefix}/filter": _timed("filter", self.filter),
            f"{prefix}/prioritize": _timed("prioritize", self.prioritize),
            f"{prefix}/bind": _timed("bind", self.bind),
        }

    def routes(self, prefix: str) -> list[web.RouteDef]:
        return [web.post(path, _of_request(verb)) for path, verb in self.verbs(prefix).items()]

    async def filter(self, body: bytes, caller: str) -> web.Response:
        try:
            args = convert.extender_args_from(convert.parse_json(body))
        except BadRequest as err:
            metrics.FAILURES.labels("filter", "bad_request").inc()
            return _bad(err)
        foreign = self._foreign(args.pod)
        if foreign:
            metrics.DECISIONS.labels("filter", "foreign_scheduler").inc()
            return _reply(convert.filter_result_to(args, (), {}, dict.fromkeys(args.names, foreign)))
        try:
            pod = convert.pod_ask_from(args.pod)
        except InvalidArgument as err:  # the pod's own resources make no sense: no node will do
            metrics.DECISIONS.labels("filter", "invalid_pod").inc()
            why = f"gpuledger cannot place this pod: {err}"
            return _reply(convert.filter_result_to(args, (), {}, dict.fromkeys(args.names, why)))
        try:
            found = self.service.filter(pod, args.names, caller)
        except GpuledgerError as err:
            metrics.FAILURES.labels("filter", err.code).inc()
            return _reply(convert.filter_error_to(f"gpuledger placement: {err}"))
        self._count_filter(pod.wants_cards, found)
        if self.preemptor is not None and pod.wants_cards and not found.fits and found.failed:
            self.preemptor.consider(args.pod, pod, found.failed)  # in the background: filter answers now
        return _reply(convert.filter_result_to(args, found.fits, found.failed, found.unresolvable))

    async def prioritize(self, body: bytes, caller: str) -> web.Response:
        try:
            args = convert.extender_args_from(convert.parse_json(body))
        except BadRequest as err:
            metrics.FAILURES.labels("prioritize", "bad_request").inc()
            return _bad(err)
        try:
            scores = self.service.prioritize(convert.pod_ask_from(args.pod), args.names)
        except InvalidArgument:  # filter has said why already; no node is better than another
            scores = dict.fromkeys(args.names, 0)
        except GpuledgerError as err:
            metrics.FAILURES.labels("prioritize", err.code).inc()
            return web.Response(status=503, text=f"gpuledger placement: {err}\n")
        metrics.DECISIONS.labels("prioritize", "scored").inc()
        return web.Response(text=convert.priorities_json(scores), content_type="application/json")

    async def bind(self, body: bytes, caller: str) -> web.Response:
        try:
            args = convert.bind_args_from(convert.parse_json(body))
        except BadRequest as err:
            metrics.FAILURES.labels("bind", "bad_request").inc()
            return _bad(err)
        if self.binder is None:
            return _reply(convert.bind_result_to("gpuledger placement: this instance does not bind"))
        try:
            bound = await self.binder.bind(args, caller)
        except GpuledgerError as err:
            metrics.FAILURES.labels("bind", err.code).inc()
            log.warning("bind of %s/%s to %s failed: %s", args.namespace, args.name, args.node, err)
            return _reply(convert.bind_result_to(f"gpuledger placement: {err}"))
        metrics.DECISIONS.labels("bind", "rebound" if bound.again else "bound").inc()
        return _reply(convert.bind_result_to())

    def _foreign(self, pod: Any) -> str:
        """Why a pod of another scheduler is not placed here ('' for a pod of ours)."""
        name = convert.pod_ref_from(pod).scheduler_name
        if name in self.schedulers:
            return ""
        return f"gpuledger places only pods of {', '.join(sorted(self.schedulers))}; this one names {name!r}"

    @staticmethod
    def _count_filter(wants: bool, found: Filtered) -> None:
        if not wants:
            metrics.DECISIONS.labels("filter", "passthrough").inc()
            return
        metrics.DECISIONS.labels("filter", "fit" if found.fits else "no_fit").inc()
        metrics.NODES_FILTERED.labels("fit").inc(len(found.fits))
        metrics.NODES_FILTERED.labels("passed_over").inc(len(found.passed_over))
        metrics.NODES_FILTERED.labels("failed").inc(len(found.failed))
        metrics.NODES_FILTERED.labels("unresolvable").inc(len(found.unresolvable))


def extender_app(
    extender: Extender, prefix: str, max_body_bytes: int, clients: frozenset[str] | None = None
) -> web.Application:
    """The verbs; ``clients``: the client certificate common names let in (None: plain HTTP)."""
    middlewares = [_only(clients)] if clients is not None else []
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    app.add_routes(extender.routes(prefix))
    return app


def _only(clients: frozenset[str]) -> Middleware:
    """Let in only callers whose verified client certificate names one of ``clients``."""

    @web.middleware
    async def authorized(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = forbidden(caller_of(request), clients)
        return refused if refused is not None else await handler(request)

    return authorized
