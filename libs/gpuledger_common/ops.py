"""The operations endpoints every service serves: /healthz, /readyz and /metrics."""

from __future__ import annotations

import ssl
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

Check = Callable[[], str]  # returns "" when ready, else why not


def ops_app(ready: Check, extra: web.Application | None = None) -> web.Application:
    app = extra or web.Application()

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        problem = ready()
        if problem:
            return web.Response(status=503, text=f"not ready: {problem}\n")
        return web.Response(text="ready\n")

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def start_http(app: web.Application, host: str, port: int, tls: ssl.SSLContext | None = None) -> web.AppRunner:
    """Serve ``app`` on ``host:port``, over TLS with ``tls``."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port actually bound (useful when asked for port 0)."""
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            port: int = server.sockets[0].getsockname()[1]
            return port
    raise RuntimeError("the HTTP server is not listening")
