"""/healthz, /readyz and /metrics over aiohttp."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def routes(ready: Callable[[], bool], alive: Callable[[], bool]) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n") if alive() else web.Response(status=503, text="stopped\n")

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready: no inventory published yet\n")

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def url_of(runner: web.AppRunner) -> str:
    """The base URL ``runner`` serves at, as bound (a port asked as 0 is the one given)."""
    bound = runner.addresses[0]
    return f"http://{bound[0]}:{bound[1]}"
