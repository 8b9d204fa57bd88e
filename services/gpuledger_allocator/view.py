"""Each replica's view of the whole ledger, kept current by watching the bucket.

Reads (get, list, cluster, candidate nodes) come from here; writes always go through the store's
compare-and-set, so a stale view can cost a retry but never a double allocation. A node whose key
holds a value that cannot be read is set aside (``unreadable``) until a readable one arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuledger_common.store import LedgerStore
from gpuledger_common.store.follow import follow
from gpuledger_core.card_usage import Usage
from gpuledger_core.events import LedgerEvent, diff
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Owner
from gpuledger_core.status import NodeStatus, node_status

log = logging.getLogger(__name__)

# Allocations seen to leave their node's key (released and pruned, or the node removed), newest
# kept: an owner record naming one is stale, not a write still on its way (owner_claims._contest).
GONE_KEPT = 65_536


@dataclass(slots=True)
class ClusterView:
    store: LedgerStore
    stale_after_s: float = 30.0
    clock: Callable[[], float] = time.time
    ledgers: dict[NodeName, NodeLedger] = field(default_factory=dict)
    revisions: dict[NodeName, int] = field(default_factory=dict)
    heartbeats: dict[NodeName, float] = field(default_factory=dict)
    usage: dict[NodeName, dict[str, Usage]] = field(default_factory=dict)  # from the inventory
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = 0.0
    applied: int = 0  # changes applied so far (a mark to tell whether anything changed since)
    latest: int = 0  # the highest revision applied: the watch brings the bucket's changes in order
    _where: dict[AllocationId, NodeName] = field(default_factory=dict)
    _subscribers: set[asyncio.Queue[LedgerEvent | None]] = field(default_factory=set)
    _owners: dict[str, AllocationId] = field(default_factory=dict)  # owner key -> live allocation
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _statuses: dict[NodeName, tuple[int, object, NodeStatus]] = field(default_factory=dict)
    _gone: dict[AllocationId, None] = field(default_factory=dict)  # left their node's key, oldest first
    # Nodes whose key holds a value that cannot be read: why, and their last readable value (set
    # aside: not listed, swept or placed on; its allocations stay indexed, their owners hold them).
    unreadable: dict[NodeName, str] = field(default_factory=dict)
    _set_aside: dict[NodeName, NodeLedger] = field(default_factory=dict)

    async def run(self) -> None:
        """Follow the bucket forever; after a lost watch, start again from a fresh snapshot."""
        self.started_at = self.clock()
        await follow(self.store, self.apply, self.ready.set, unreadable=self.unreadable_value)

    def apply(self, node: NodeName, ledger: NodeLedger | None, revision: int) -> None:
        if revision and revision <= self.revisions.get(node, 0) and ledger is not None:
            return  # an older value than one we already applied (our own write got here first)
        self.store.remember(node, ledger, revision)
        old = self.ledgers.get(node)
        if self.unreadable and node in self.unreadable:  # readable again: its last readable value came before
            del self.unreadable[node]
            old = self._set_aside.pop(node, None)
            log.info("the ledger value of node %s can be read again", node)
        before = {a.id: a for a in old.allocations} if old is not None else {}
        if ledger is None:
            self.ledgers.pop(node, None)
            self.revisions.pop(node, None)
        else:
            self.ledgers[node] = ledger
            self.revisions[node] = revision
            for allocation in ledger.allocations:
                if before.pop(allocation.id, None) is allocation:
                    continue  # unchanged: indexed already
                self._where[allocation.id] = node
                if allocation.live:
                    self._owners[allocation.owner.key] = allocation.id
                elif self._owners.get(allocation.owner.key) == allocation.id:
                    del self._owners[allocation.owner.key]
        for allocation in before.values():  # pruned from the node's key: forgotten here too
            if self._where.get(allocation.id) == node:
                del self._where[allocation.id]
                if self._owners.get(allocation.owner.key) == allocation.id:
                    del self._owners[allocation.owner.key]
            self._gone[allocation.id] = None
            if len(self._gone) > GONE_KEPT:
                del self._gone[next(iter(self._gone))]
        if self._subscribers:
            self._publish(diff(old, ledger, revision))
        self.applied += 1
        self.latest = max(self.latest, revision)
        self._changed.set()
        self._changed = asyncio.Event()

    def unreadable_value(self, node: NodeName, revision: int, why: str) -> None:
        """The node's key holds a value that cannot be read (``why``): nothing new goes on the node
        until a readable one arrives. Its last readable value is set aside: not listed, swept or
        placed on, while its allocations stay indexed (their owners still hold them)."""
        if revision and revision <= self.revisions.get(node, 0):
            return  # this value, again (a fresh snapshot), or an older one
        self.unreadable[node] = why
        last = self.ledgers.pop(node, None)
        if last is not None:
            self._set_aside[node] = last
        self._statuses.pop(node, None)
        self.revisions[node] = revision
        self.applied += 1
        self.latest = max(self.latest, revision)
        self._changed.set()
        self._changed = asyncio.Event()

    def why_unreadable(self, node: str) -> str | None:
        """Why nothing new goes on the node because its ledger value cannot be read; None if it can."""
        why = self.unreadable.get(NodeName(node)) if self.unreadable else None
        if why is None:
            return None
        return f"{node}: its ledger value cannot be read ({why}); nothing new goes there until it holds a readable one"

    async def changed(self, timeout_s: float) -> None:
        """Wait until the view next changes, or ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()

    def _publish(self, events: tuple[LedgerEvent, ...]) -> None:
        for event in events:
            for queue in list(self._subscribers):
                try:
                    queue.put_nowait(event)
                except asyncio.QueueFull:  # a watcher that cannot keep up is cut off
                    self._subscribers.discard(queue)
                    with contextlib.suppress(asyncio.QueueFull):
                        queue.get_nowait()
                    queue.put_nowait(None)

    def subscribe(self, depth: int = 4096) -> asyncio.Queue[LedgerEvent | None]:
        """Events from now on; ``None`` means the watcher fell behind and was dropped."""
        queue: asyncio.Queue[LedgerEvent | None] = asyncio.Queue(depth)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[LedgerEvent | None]) -> None:
        self._subscribers.discard(queue)

    def snapshot_events(self) -> list[LedgerEvent]:
        """The current state as events: each node, then each live allocation."""
        return [
            event
            for name, ledger in sorted(self.ledgers.items())
            for event in diff(None, NodeLedger(ledger.node, ledger.live()), self.revisions.get(name, 0))
        ]

    def owned_by(self, owner: Owner) -> AllocationId | None:
        """The owner's live allocation, as far as this view has seen."""
        return self._owners.get(owner.key)

    def left_its_node(self, allocation_id: AllocationId) -> bool:
        """Whether this view saw the allocation in its node's key and then leave it (released
        and pruned, or the node removed): it was written, and is gone for good. Of the newest
        ``GONE_KEPT`` such allocations; False for one this view never saw (say, from before
        its replica started)."""
        return allocation_id in self._gone

    def node_of(self, allocation_id: AllocationId) -> NodeName | None:
        return self._where.get(allocation_id)

    def allocation(self, allocation_id: AllocationId) -> Allocation | None:
        node = self._where.get(allocation_id)
        ledger = self.ledgers.get(node) if node else None
        return ledger.get(allocation_id) if ledger else None

    def status(self, node: NodeName) -> NodeStatus | None:
        """The node's cards, what is free on them and who holds them (not ``stale``), made once
        per revision of its key and per inventory report of its usage."""
        ledger = self.ledgers.get(node)
        if ledger is None:
            self._statuses.pop(node, None)
            return None
        revision, usage = self.revisions.get(node, 0), self.usage.get(node)
        known = self._statuses.get(node)
        if known is not None and known[0] == revision and known[1] is usage:
            return known[2]
        made = node_status(ledger, revision=revision, usage=usage)
        self._statuses[node] = (revision, usage, made)
        return made

    def heartbeat(self, node: NodeName, at: float) -> None:
        self.heartbeats[node] = max(at, self.heartbeats.get(node, 0.0))

    def stale(self, node: NodeName) -> bool:
        """No heartbeat for ``stale_after_s`` (counting from this replica's start if none yet)."""
        last = self.heartbeats.get(node, self.started_at or self.clock())
        return self.clock() - last > self.stale_after_s

    def stale_nodes(self) -> list[NodeName]:
        """Every node of the ledger that is ``stale``, in one pass."""
        now = self.clock()
        since, limit, beats = self.started_at or now, now - self.stale_after_s, self.heartbeats
        return [name for name in self.ledgers if beats.get(name, since) < limit]
