"""The dashboard's views as JSON: ``GET /api/summary`` (the cluster's totals, its models and a
filtered page of node rows: ``overview.py``), ``GET /api/nodes/<node>`` (a node's cards and
holders, each holder with its isolation tier and MIG placement, each card in MIG mode with its
count of memory slices) and ``GET /api/history?node=&hours=`` (the sampled
trends: ``trends.py``). Bad input is a 400 naming the field."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

import orjson
from aiohttp import web

from gpuledger_allocator.overview import MAX_PAGE, NODE_STATES, Filter, Overview, row_json, summary
from gpuledger_allocator.queries import node_in
from gpuledger_allocator.trends import Trends
from gpuledger_core import codec_status, mig
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import AllocationId, NodeName

Handler = Callable[[web.Request], Awaitable[web.Response]]


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _number(query: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = query.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise InvalidArgument(name, f"must be a number, got {raw[:40]!r}") from None
    if not low <= value <= high:
        raise InvalidArgument(name, f"must be {low:g}..{high:g}, got {value:g}")
    return value


def parse_filter(query: Mapping[str, str]) -> Filter:
    state = query.get("state", "")
    if state and state not in NODE_STATES:
        raise InvalidArgument("state", f"must be one of {', '.join(NODE_STATES)}, got {state[:40]!r}")
    return Filter(query.get("q", "").strip(), query.get("model", ""), query.get("namespace", ""), state)


def overview_routes(overview: Overview, trends: Trends, clock: Callable[[], float] = time.time) -> web.RouteTableDef:
    routes = web.RouteTableDef()

    def answering(make: Callable[[web.Request], object]) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            try:
                return _json(make(request))
            except InvalidArgument as err:
                return _json({"error": str(err)}, 400)
            except LookupError as err:
                return _json({"error": str(err.args[0])}, 404)

        return handler

    def cluster_summary(request: web.Request) -> object:
        q = request.query
        page = int(_number(q, "page", 0, 0, 1e9))
        return summary(overview, parse_filter(q), page, int(_number(q, "size", 50, 1, MAX_PAGE)))

    def node(request: web.Request) -> object:
        name = request.match_info["node"]
        status = node_in(overview.view, NodeName(name))
        row = overview.row(NodeName(name))
        if status is None or row is None:
            raise LookupError(f"node {name[:80]!r} is not in the ledger")
        body = codec_status.node_status_to(status)
        for card, c in zip(body["cards"], status.cards, strict=True):
            if c.card.mig and (model := mig.model_of(c.card)) is not None:
                card["mig_slices"] = model.memory_slices  # the dashboard draws the card as its slices
            for holder in card["holders"]:
                allocation = overview.view.allocation(AllocationId(holder["allocation_id"]))
                holder["isolation"] = allocation.isolation.value if allocation is not None else None
        return {"node": body, "row": row_json(row)}

    def history(request: web.Request) -> object:
        q = request.query
        return trends.answer(q.get("node", ""), _number(q, "hours", 1.0, 0, 24 * 14), clock())

    routes.get("/api/summary")(answering(cluster_summary))
    routes.get("/api/nodes/{node}")(answering(node))
    routes.get("/api/history")(answering(history))
    return routes
