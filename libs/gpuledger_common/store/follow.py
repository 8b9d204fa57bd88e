"""Following a watch for ever: restart it after it fails, and at once whenever NATS has
reconnected (a JetStream watch can stall silently across a server restart)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Generic, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg

from gpuledger_common.store.ledgerstore import LedgerStore
from gpuledger_common.store.unreadable import Unreadable
from gpuledger_common.tasks import cancelled
from gpuledger_core.errors import Unavailable
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


class _Reconnected:
    """Put on a pump's queue when NATS reconnected while it ran."""


RECONNECTED = _Reconnected()


class _Pump(Generic[T]):
    """Runs one watch in its own task; its items, its end or its error arrive on a queue, and so
    does ``RECONNECTED`` if NATS reconnects meanwhile (checked every ``check_s``)."""

    def __init__(self, nc: Client, watch: Callable[[], AsyncIterator[T]], check_s: float) -> None:
        self.queue: asyncio.Queue[tuple[bool, T | BaseException | _Reconnected | None]] = asyncio.Queue()
        self.tasks = (
            asyncio.create_task(self._run(watch)),
            asyncio.create_task(self._watchdog(nc, reconnects(nc), check_s)),
        )

    async def _run(self, watch: Callable[[], AsyncIterator[T]]) -> None:
        try:
            async for item in watch():
                self.queue.put_nowait((True, item))
            self.queue.put_nowait((False, None))
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.queue.put_nowait((False, err))

    async def _watchdog(self, nc: Client, seen: int, check_s: float) -> None:
        while reconnects(nc) == seen:
            await asyncio.sleep(check_s)
        self.queue.put_nowait((False, RECONNECTED))

    async def close(self) -> None:
        """Cancel both tasks and wait until they have ended. Both are cancelled before any wait, and
        the wait goes on shielded: a cancellation of the caller meanwhile (a stop repeats its
        cancel) ends the caller's wait, not the closing, so neither task is left running."""
        for task in self.tasks:
            task.cancel()
        ending = asyncio.ensure_future(self._ended())
        _ENDING.add(ending)  # held until done: the loop keeps only weak references to tasks
        ending.add_done_callback(_ENDING.discard)
        await asyncio.shield(ending)

    async def _ended(self) -> None:
        for task in self.tasks:
            await cancelled(task)  # a watch starting (NATS requests) can lose one cancellation


_ENDING: set[asyncio.Future[None]] = set()  # pumps' closings still under way


async def resilient(
    nc: Client, watch: Callable[[], AsyncIterator[T]], retry_s: float = RETRY_S, check_s: float = CHECK_S
) -> AsyncGenerator[T, None]:
    """Every item of ``watch()``, which is started again after it ends or fails (after
    ``retry_s``) and at once after NATS reconnected; each start yields a fresh snapshot first."""
    while True:
        pump: _Pump[T] = _Pump(nc, watch, check_s)
        again_now = False
        try:
            while True:
                is_item, value = await pump.queue.get()
                if is_item:
                    yield value  # type: ignore[misc]
                    continue
                if isinstance(value, _Reconnected):
                    log.info("NATS reconnected; watching again from a fresh snapshot")
                    again_now = True
                elif value is not None:
                    log.warning("watch lost (%s); watching again in %.0fs", value, retry_s)
                break
        finally:
            await pump.close()
        if not again_now:
            await asyncio.sleep(retry_s)


async def follow(
    store: LedgerStore,
    apply: Apply,
    caught_up: Callable[[], None],
    retry_s: float = RETRY_S,
    check_s: float = CHECK_S,
    *,
    unreadable: Unreadable | None = None,
) -> None:
    """Call ``apply`` for every value of every node's key, for ever, straight from the watch's
    callback; ``unreadable`` for a value that cannot be read (that node's problem alone:
    ``gpuledger_common.store.unreadable``). ``caught_up`` is called each time a snapshot has been
    applied in full. The watch starts again from a fresh snapshot at once after NATS reconnected,
    and after ``retry_s`` when it could not start or a value could not be applied."""
    while True:
        seen = reconnects(store.nc)
        try:
            following = await store.follow_values(apply, caught_up, unreadable)
        except Exception as err:
            log.warning("watch lost (%s); watching again in %.0fs", err, retry_s)
            await asyncio.sleep(retry_s)
            continue
        try:
            while following.failed is None and reconnects(store.nc) == seen:
                await asyncio.sleep(check_s)
        finally:
            await following.stop()
        if following.failed is not None:
            log.warning("watch lost (%s); watching again in %.0fs", following.failed, retry_s)
            await asyncio.sleep(retry_s)
        else:
            log.info("NATS reconnected; watching again from a fresh snapshot")


async def node_ledger(
    store: LedgerStore, node: str, retry_s: float = RETRY_S
) -> AsyncGenerator[NodeLedger | None, None]:
    """One node's ledger now and after every change (None: no key); watched again after NATS
    trouble or a watch lost with its server (``keywatch``), each time from a fresh snapshot."""

    async def once() -> AsyncIterator[NodeLedger | None]:
        values: asyncio.Queue[NodeLedger | _Lost | None] = asyncio.Queue()

        def deliver(msg: Msg) -> None:
            operation = msg.headers.get("KV-Operation") if msg.headers else None
            values.put_nowait(store.watched_value(node, msg.data, operation))

        try:
            watch = await store.key_watch(node, deliver, lost=lambda: values.put_nowait(LOST)).start()
        except Exception as err:
            raise Unavailable(f"cannot watch the ledger of {node}: {err}") from err
        try:
            # No timeout around the wait: the watch puts LOST when it fails. (A wait_for in a loop
            # lost the task's cancellation when it came as the timeout ran out: Python 3.11.)
            while not isinstance(value := await values.get(), _Lost):
                yield value
            raise Unavailable(f"ledger watch of {node} failed: {watch.failed}")
        finally:
            await watch.stop()

    async with contextlib.aclosing(resilient(store.nc, once, retry_s)) as ledgers:  # closed with this one
        async for ledger in ledgers:
            yield ledger


class _Lost:
    """Put on a node watch's queue when the watch failed."""


LOST = _Lost()
