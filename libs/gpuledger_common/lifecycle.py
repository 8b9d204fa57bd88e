"""A service's parts, stopped in the reverse of the order they started, on every way out.

Each service's ``serve()`` keeps its parts on one ``contextlib.AsyncExitStack``: a part goes on
the stack as soon as it has started (an HTTP runner before the step that binds its port, which
may fail), so a normal stop, a failure while a later part starts, and a cancellation all stop
what is running, the last started first. What must stop late is started early: NATS, which every
other part answers or publishes through, is connected first and drained last. These helpers put
the parts every service has on the stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.natscreds import NatsClientSettings, credentials_of
from gpuledger_common.tasks import cancelled
from gpuledger_core.errors import Unavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
DRAIN_S = 10.0  # the longest NATS may take to drain at a stop


async def nats_client(
    stack: contextlib.AsyncExitStack,
    settings: NatsClientSettings,
    name: str,
    stop: asyncio.Event | None,
    drain_s: float = DRAIN_S,
) -> Client | None:
    """NATS, drained when the stack closes (after every part that started later). None when
    ``stop`` was set while no server had answered yet: nothing else was started."""
    try:
        nc = await bus.connect(settings.nats_url, name, stop=stop, credentials=credentials_of(settings))
    except Unavailable:
        if stop is not None and stop.is_set():
            log.info("%s stopped before NATS answered", name)
            return None
        raise
    stack.push_async_callback(drain, nc, drain_s)
    return nc


async def drain(nc: Client, timeout_s: float = DRAIN_S) -> None:
    """Drain ``nc`` (its subscriptions answered, its publications flushed); errors only logged:
    a server that went away has nothing left to drain to."""
    try:
        async with asyncio.timeout(timeout_s):
            await nc.drain()
    except Exception as err:
        log.debug("NATS drain ended early: %s", err or type(err).__name__)
        with contextlib.suppress(Exception):
            await nc.close()


async def http_site(
    stack: contextlib.AsyncExitStack, app: web.Application, host: str, port: int, tls: ssl.SSLContext | None = None
) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` (over TLS with ``tls``); the runner is on the stack before the
    port is bound, so a port already taken leaves nothing behind."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await web.TCPSite(runner, host, port, ssl_context=tls).start()
    return runner


async def ready_or_stopped(ready: asyncio.Event, stop: asyncio.Event) -> bool:
    """Wait until ``ready`` is set (True) or ``stop`` is (False, even when both are): a service told
    to stop while a part is still loading stops, rather than waiting for a load that may never end."""
    if not ready.is_set():
        waits = [asyncio.ensure_future(event.wait()) for event in (ready, stop)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
    return ready.is_set() and not stop.is_set()


async def task_group(stack: contextlib.AsyncExitStack) -> asyncio.TaskGroup:
    """A task group on the stack: the tasks ``background`` starts in it are cancelled before it
    closes, and a task that fails stops the service (its error raised from ``serve``)."""
    return await stack.enter_async_context(asyncio.TaskGroup())


def background(
    stack: contextlib.AsyncExitStack, tasks: asyncio.TaskGroup, work: Coroutine[Any, Any, T], name: str | None = None
) -> asyncio.Task[T]:
    """Run ``work`` in ``tasks`` until the stack closes, then cancel it (``tasks.cancelled``: a
    cancel lost in a NATS request is repeated) and wait for it to end."""
    task = tasks.create_task(work, name=name)
    stack.push_async_callback(cancelled, task)
    return task


def bounded(seconds: float, stop: Callable[[], Awaitable[Any]], what: str) -> Callable[[], Awaitable[None]]:
    """``stop`` as a stop callback: cut short after ``seconds``, an error logged, not raised (a part
    that fails to stop must not keep the service from ending cleanly)."""

    async def run() -> None:
        try:
            async with asyncio.timeout(seconds):
                await stop()
        except Exception as err:
            log.warning("%s did not stop cleanly: %s", what, err or type(err).__name__)

    return run
