"""The ledger in a JetStream key-value bucket: one key per node, every change a compare-and-set.

Any number of allocator, placement or plugin processes may write; each write reads the node's
key, applies a pure transition from ``gpuledger_core.ledger`` and writes back only if the key's
revision is unchanged. Lost races are retried a bounded number of times and counted. Changes of
one node that a process makes while its write to that node is in flight are written together, in
the order they were asked, by the next compare-and-set (each caller still gets its own answer).

Every read and write rides out a JetStream outage (a leader election, a reconnect) within the
call's window (``gpuledger_common.store.outage``). A write whose answer was lost is tried again with
the same bytes on the same revision: if the first one was applied, the second fails as a
conflict, and the message that took that revision's place says whether it was ours. So a write
is applied at most once, and never over a change it did not see (docs/ledger.md).

``LedgerStore`` is the face of the parts that do this, one concern each: ``buckets`` (the
connection and both buckets), ``cas`` (a compare-and-set ridden out), ``writes`` (one change of a
node), ``batches`` (a node's changes in turn, written together), ``yielding`` (a hot key yielded to
another writer), ``values`` and ``splice`` (values decoded and encoded, reusing what is known),
``known`` (the newest value seen of each node), ``listing`` and ``feed`` (listing and following the
nodes; ``unreadable``: a value that cannot be read), ``owners`` (the owner index) and ``events``.
Its methods hand back their part's coroutine (no await of their own between the caller and the
part); ``mutate`` only opens the call's outage window around it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from gpuledger_common.store.batches import Batches
from gpuledger_common.store.buckets import Buckets, open_buckets
from gpuledger_common.store.events import Events
from gpuledger_common.store.feed import Apply, Feed, Following
from gpuledger_common.store.keywatch import KeyWatch
from gpuledger_common.store.known import Known
from gpuledger_common.store.listing import Listing
from gpuledger_common.store.outage import RETRY_S, OutageStats, within
from gpuledger_common.store.owners import OwnerIndex, OwnerRecord
from gpuledger_common.store.unreadable import BadValues, Unreadable
from gpuledger_common.store.values import Values
from gpuledger_common.store.writes import CasStats, Transition, Writes, Written
from gpuledger_common.store.yielding import Yielding
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Owner


class LedgerStore:
    """The ledger's store; ``open`` makes one. ``remember`` and ``watched_value`` are the parts' own
    methods (``Known.remember``, ``Values.watched``: a watch calls them for every change)."""

    __slots__ = (
        "_batches",
        "_buckets",
        "_feed",
        "_index",
        "_known",
        "_listing",
        "_writes",
        "_yielding",
        "nc",
        "remember",
        "watched_value",
    )

    def __init__(self, buckets: Buckets, max_attempts: int = 12, clock: Callable[[], float] = time.time) -> None:
        values = Values()
        known = Known(values.written, values.newer)
        yielding = Yielding(buckets.nc, known.latest)
        writes = Writes(buckets, values, known, yielding, Events(buckets.nc), max_attempts, clock)
        batches = Batches(writes, yielding.until)
        known.paused, known.resume = batches.paused, batches.resume
        bad = BadValues(known)
        listing = Listing(buckets, values, bad)
        self.nc = buckets.nc
        self.remember: Callable[[str, NodeLedger | None, int], None] = known.remember
        self.watched_value: Callable[[str, bytes | None, str | None], NodeLedger | None] = values.watched
        self._buckets, self._known, self._yielding = buckets, known, yielding
        self._writes, self._batches, self._listing = writes, batches, listing
        self._feed = Feed(buckets, values, known, yielding, listing, bad)
        self._index = OwnerIndex(buckets, clock)

    @classmethod
    async def open(
        cls,
        nc: Client,
        *,
        replicas: int = 1,
        max_attempts: int = 12,
        record_ttls: bool = False,
        retry_s: float = RETRY_S,
        deny_rollups: bool = False,
    ) -> LedgerStore:
        """The store over both buckets (made if missing). With ``record_ttls`` (the allocator,
        which writes expiring owner records) the owners bucket is made to keep per-message TTLs,
        and ``records_expire`` says whether the server does. ``retry_s``: how long each call
        waits out a JetStream outage; opening waits it out too. With ``deny_rollups`` (the
        allocator, which owns the buckets) both streams refuse ``Nats-Rollup`` headers: a put
        on a node's own key with ``Nats-Rollup: all`` would otherwise purge every other key,
        which no subject permission can stop."""
        buckets = await open_buckets(
            nc, replicas=replicas, retry_s=retry_s, record_ttls=record_ttls, deny_rollups=deny_rollups
        )
        return cls(buckets, max_attempts)

    # --- writing ---

    async def mutate(self, node: str, transition: Transition, attempts: int | None = None) -> Written:
        """Apply ``transition`` to the node's current ledger with compare-and-set.

        The transition sees the ledger after expired leases and old releases are tidied away,
        and may raise (nothing is written then; changes written beside it are not affected).
        Returns what was written, or the unchanged state when nothing changed. Writes to one
        node from this process take turns, so compare-and-set only ever races with other
        processes; the changes asked while a write is in flight are applied in order and
        written together by the next one (``old`` is then the value before all of them).
        ``attempts``: how many lost races to take before ``Conflict`` (default ``max_attempts``);
        a caller that can go elsewhere (a reservation) asks for one.
        """
        with within(self._buckets.retry_s):  # the read, the write and any retries: one outage window
            return await self._batches.in_turn(node, transition, attempts or self._writes.max_attempts)

    def read(self, node: str) -> Coroutine[Any, Any, tuple[NodeLedger | None, int]]:
        """The node's ledger (None: no key) and its revision, read from the bucket now."""
        return self._writes.read(node)

    def won_elsewhere(self, within_s: float) -> set[str]:
        """Nodes whose newest value another process wrote, arriving here within the last ``within_s``."""
        return self._known.won_elsewhere(within_s)

    def crowded(self) -> set[str]:
        """Nodes this process is writing right now, or lost a race on to another process lately."""
        return self._known.hot_nodes() | set(self._batches.in_flight)

    # --- listing and following ---

    def nodes(self) -> Coroutine[Any, Any, dict[NodeName, tuple[NodeLedger, int]]]:
        """Every node's ledger as it is now."""
        return self._listing.nodes()

    def snapshot(self) -> AsyncIterator[tuple[NodeName, NodeLedger | None, int]]:
        """Every node's current value (None: deleted) and revision (``Listing.snapshot``)."""
        return self._listing.snapshot()

    def node_names(self) -> Coroutine[Any, Any, list[NodeName]]:
        """The nodes whose keys the bucket holds now (from the stream's info: no consumer)."""
        return self._listing.node_names()

    def key_watch(
        self, node: str | None, deliver: Callable[[Msg], None], lost: Callable[[], None] = lambda: None
    ) -> KeyWatch:
        """A watch (not started) of the node's key, or of every node's key with None (``keywatch``)."""
        return self._listing.key_watch(node, deliver, lost)

    def follow_values(
        self, apply: Apply, caught_up: Callable[[], None], unreadable: Unreadable | None = None
    ) -> Coroutine[Any, Any, Following]:
        """Every node's value, then every change, handed to ``apply``; a value that cannot be read
        to ``unreadable`` (``Feed.follow``)."""
        return self._feed.follow(apply, caught_up, unreadable)

    # --- the owner index ---

    def owner_of(self, owner: Owner) -> Coroutine[Any, Any, tuple[AllocationId, NodeName, int] | None]:
        return self._index.owner_of(owner)

    def owner_record(self, owner: Owner) -> Coroutine[Any, Any, OwnerRecord | None]:
        return self._index.record(owner)

    def claim_owner(
        self, owner: Owner, allocation: AllocationId, node: str, revision: int = 0, ttl_s: float | None = None
    ) -> Coroutine[Any, Any, int | None]:
        """Record ``allocation`` as the owner's (``OwnerIndex.claim``): its new revision, or None if
        someone else's record is in the way."""
        return self._index.claim(owner, allocation, node, revision, ttl_s)

    def forget_owner_of(self, owner: Owner, allocation_id: AllocationId) -> Coroutine[Any, Any, None]:
        """Drop the owner's record if it still names ``allocation_id``."""
        return self._index.forget_owner_of(owner, allocation_id)

    def forget_owner(self, owner: Owner, revision: int) -> Coroutine[Any, Any, None]:
        """Drop the owner's record if it is still the one read at ``revision``."""
        return self._index.forget(owner, revision)

    # --- settings and figures, kept by the parts that use them ---

    @property
    def kv(self) -> KeyValue:
        return self._buckets.kv

    @kv.setter
    def kv(self, kv: KeyValue) -> None:
        self._buckets.kv = kv

    @property
    def owners(self) -> KeyValue:
        return self._buckets.owners

    @property
    def retry_s(self) -> float:
        """How long a call waits out a JetStream outage (``outage.within`` narrows it)."""
        return self._buckets.retry_s

    @retry_s.setter
    def retry_s(self, seconds: float) -> None:
        self._buckets.retry_s = seconds

    @property
    def records_expire(self) -> bool:
        """The server drops owner records at their TTL (see ``open``)."""
        return self._buckets.records_expire

    @records_expire.setter
    def records_expire(self, expire: bool) -> None:
        self._buckets.records_expire = expire

    @property
    def outage(self) -> OutageStats:
        return self._buckets.outage

    @property
    def stats(self) -> CasStats:
        return self._writes.stats

    @property
    def written_up_to(self) -> int:
        """The bucket's sequence at this process's latest ledger write (or below it)."""
        return self._writes.written_up_to

    @property
    def max_attempts(self) -> int:
        return self._writes.max_attempts

    @property
    def clock(self) -> Callable[[], float]:
        return self._writes.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._writes.clock = self._index.clock = clock

    @property
    def catch_up_s(self) -> float:
        """After a lost race, how long a followed store waits for its watch to bring the winner."""
        return self._known.catch_up_s

    @catch_up_s.setter
    def catch_up_s(self, seconds: float) -> None:
        self._known.catch_up_s = seconds

    @property
    def yield_s(self) -> float:
        """How long a write to a node is held when another writer asks."""
        return self._yielding.yield_s

    @yield_s.setter
    def yield_s(self, seconds: float) -> None:
        self._yielding.yield_s = seconds
