"""The web dashboard (docs/dashboard.md): the static page (cluster, node and card views), the
cluster as JSON, its aggregates and trends (api_overview.py), the ledger's events as SSE, and a
card's history (api_history.py: asked of its node's inventory)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import orjson
from aiohttp import web

from gpuledger_allocator.api_history import AskInventory, history_route
from gpuledger_allocator.api_overview import overview_routes
from gpuledger_allocator.overview import Overview
from gpuledger_allocator.queries import cluster
from gpuledger_allocator.trends import Trends
from gpuledger_allocator.view import ClusterView
from gpuledger_core import codec, codec_status


def _json_text(value: object) -> str:
    return orjson.dumps(value).decode()


STATIC = Path(__file__).resolve().parent / "static"
KEEPALIVE_S = 15.0


def dashboard_app(
    view: ClusterView, ask_inventory: AskInventory, overview: Overview, trends: Trends
) -> web.Application:
    app = web.Application()

    async def index(_: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def cluster_json(request: web.Request) -> web.Response:
        nodes = cluster(view, request.query.get("node", ""), request.query.get("model", ""))
        # orjson: the standard library's encoder took five times as long (76 against 15 us a
        # node with the conversion; 0.38 s of the event loop for a dashboard of 5,000 nodes).
        return web.json_response({"nodes": [codec_status.node_status_to(n) for n in nodes]}, dumps=_json_text)

    async def events(request: web.Request) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        queue = view.subscribe()
        try:
            await stream.write(b": following the ledger\n\n")
            while True:
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        event = await queue.get()
                except TimeoutError:
                    await stream.write(b": keep-alive\n\n")
                    continue
                if event is None:  # fell behind; the page reconnects and refetches
                    break
                await stream.write(f"data: {json.dumps(codec.event_to(event))}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            view.unsubscribe(queue)
        return stream

    app.router.add_get("/", index)
    app.router.add_get("/api/cluster", cluster_json)
    app.router.add_get("/api/events", events)
    app.router.add_get("/api/nodes/{node}/cards/{uuid}/history", history_route(view, ask_inventory))
    app.router.add_routes(overview_routes(overview, trends))
    app.router.add_static("/static", STATIC)
    return app
