"""Following a watch for ever: restart it after it fails, and at once whenever NATS has
reconnected (a JetStream watch can stall silently across a server restart)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from nats.aio.client import Client

from gpuledger_common.store import LedgerStore
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger

log = logging.getLogger(__name__)
RETRY_S = 1.0
CHECK_S = 0.25
Apply = Callable[[NodeName, NodeLedger | None, int], None]
T = TypeVar("T")


def reconnects(nc: Client) -> int:
    count: int = nc.stats.get("reconnects", 0)
    return count


class _Pump(Generic[T]):
    """Runs one watch in its own task; its items, its end or its error arrive on a queue."""

    def __init__(self, watch: Callable[[], AsyncIterator[T]]) -> None:
        self.queue: asyncio.Queue[tuple[bool, T | BaseException | None]] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(watch))

    async def _run(self, watch: Callable[[], AsyncIterator[T]]) -> None:
        try:
            async for item in watch():
                await self.queue.put((True, item))
            await self.queue.put((False, None))
        except asyncio.CancelledError:
            raise
        except Exception as err:
            await self.queue.put((False, err))

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


async def resilient(
    nc: Client, watch: Callable[[], AsyncIterator[T]], retry_s: float = RETRY_S, check_s: float = CHECK_S
) -> AsyncIterator[T]:
    """Every item of ``watch()``, which is started again after it ends or fails (after
    ``retry_s``) and at once after NATS reconnected; each start yields a fresh snapshot first."""
    while True:
        seen = reconnects(nc)
        pump: _Pump[T] = _Pump(watch)
        getter: asyncio.Task[tuple[bool, T | BaseException | None]] | None = None
        again_now = False
        try:
            while True:
                getter = getter or asyncio.create_task(pump.queue.get())
                done, _ = await asyncio.wait({getter}, timeout=check_s)
                if not done:
                    if reconnects(nc) != seen:
                        log.info("NATS reconnected; watching again from a fresh snapshot")
                        again_now = True
                        break
                    continue
                is_item, value = getter.result()
                getter = None
                if not is_item:
                    if value is not None:
                        log.warning("watch lost (%s); watching again in %.0fs", value, retry_s)
                    break
                yield value  # type: ignore[misc]
        finally:
            if getter is not None:
                getter.cancel()
            await pump.close()
        if not again_now:
            await asyncio.sleep(retry_s)


async def follow(store: LedgerStore, apply: Apply, caught_up: Callable[[], None], retry_s: float = RETRY_S) -> None:
    """Call ``apply`` for every value of every node's key, for ever. ``caught_up`` is called each
    time a snapshot has been applied in full."""
    async for item in resilient(store.nc, store.watch_marked, retry_s):
        if item is None:
            caught_up()
        else:
            apply(*item)
