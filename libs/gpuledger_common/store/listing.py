"""Listing the ledger's nodes: their names, a snapshot of every node's value, and a watch of one
node's key (or of all) that this process checks itself (``keywatch``).

A snapshot ends once every key the bucket held when it began has arrived (the keys are asked of
the stream first): neither the client's end-of-snapshot marker nor the messages' pending counts can
be trusted for that when the machine is busy. A value that cannot be read is left out of it (and
logged, ``unreadable``): it is that node's problem alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from gpuledger_common.store.buckets import KEY_PREFIX, LEDGER_BUCKET, Buckets, node_key
from gpuledger_common.store.keywatch import KeyWatch
from gpuledger_common.store.outage import MIN_ATTEMPT_S, time_left
from gpuledger_common.store.unreadable import BadValues
from gpuledger_common.store.values import UnreadableValue, Values
from gpuledger_core.errors import Unavailable
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger


class _WatchEnded(Exception):
    """A watcher stopped before the snapshot was complete."""


@dataclass(slots=True)
class Listing:
    buckets: Buckets
    values: Values
    bad: BadValues

    async def nodes(self) -> dict[NodeName, tuple[NodeLedger, int]]:
        """Every node's ledger as it is now."""
        found: dict[NodeName, tuple[NodeLedger, int]] = {}
        async for node, ledger, revision in self.snapshot():
            if ledger is not None:
                found[node] = (ledger, revision)
        return found

    async def snapshot(self) -> AsyncIterator[tuple[NodeName, NodeLedger | None, int]]:
        """Every node's current value (None: deleted) and revision; not a value that cannot be read.

        It ends once every key the bucket held when it began has arrived (the keys are asked of
        the stream first). Neither the client's end-of-snapshot marker nor the messages' pending
        counts can be trusted for that when the machine is busy.
        """
        try:
            keys = await self.buckets.ride_out("list the ledger's nodes", self.keys_now)
            if not keys:
                return
            watcher = await self.buckets.ride_out("watch the ledger", lambda: self.buckets.kv.watch("node.>"))
        except Unavailable:
            raise
        except Exception as err:
            raise Unavailable(f"cannot watch the ledger: {err}") from err
        try:
            while True:
                try:
                    entry = await self._next_entry(watcher)
                except _WatchEnded:
                    return
                if entry is None:  # the client's marker: see above
                    continue
                node, revision = NodeName(entry.key.removeprefix("node.")), entry.revision or 0
                try:
                    value = self.values.watched(node, entry.value, entry.operation)
                except UnreadableValue as err:  # the node's problem alone: the others are listed
                    self.bad.noted(node, revision, err)
                else:
                    yield node, value, revision
                keys.discard(entry.key)
                if not keys:
                    return
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]

    async def _next_entry(self, watcher: KeyValue.KeyWatcher) -> KeyValue.Entry | None:
        """The watch's next entry, within the call's outage window, or ``retry_s`` outside one (a
        stream that lost its leader mid-snapshot sends nothing more)."""
        wait = max(time_left(self.buckets.retry_s), MIN_ATTEMPT_S)
        try:
            async with asyncio.timeout(wait):
                entry: KeyValue.Entry | None = await anext(watcher)
        except TimeoutError:
            raise Unavailable("cannot read the ledger: its snapshot stalled (JetStream has no leader?)") from None
        except StopAsyncIteration:  # the watcher was stopped
            raise _WatchEnded() from None
        return entry

    async def node_names(self) -> list[NodeName]:
        """The nodes whose keys the bucket holds now (from the stream's info: no consumer)."""
        try:
            keys = await self.buckets.ride_out("list the ledger's nodes", self.keys_now)
        except Unavailable:
            raise
        except Exception as err:
            raise Unavailable(f"cannot list the ledger's nodes: {err}") from err
        return sorted(NodeName(key.removeprefix("node.")) for key in keys)

    async def keys_now(self) -> set[str]:
        """The node keys the bucket holds now: a snapshot is complete once all have arrived."""
        info = await self.buckets.js.stream_info(f"KV_{LEDGER_BUCKET}", subjects_filter=f"{KEY_PREFIX}node.>")
        return {subject.removeprefix(KEY_PREFIX) for subject in (info.state.subjects or {})}

    def key_watch(
        self, node: str | None, deliver: Callable[[Msg], None], lost: Callable[[], None] = lambda: None
    ) -> KeyWatch:
        """A watch (not started) of the node's key, or of every node's key with None
        (``keywatch``: it says when its consumer is gone within seconds, calling ``lost``)."""
        subject = f"{KEY_PREFIX}{node_key(node) if node is not None else 'node.>'}"
        return KeyWatch(self.buckets.nc, self.buckets.js, f"KV_{LEDGER_BUCKET}", subject, deliver, lost)
