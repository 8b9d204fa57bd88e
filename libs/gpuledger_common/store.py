"""The ledger in a JetStream key-value bucket: one key per node, every change a compare-and-set.

Any number of allocator, placement or plugin processes may write; each write reads the node's
key, applies a pure transition from ``gpuledger_core.ledger`` and writes back only if the key's
revision is unchanged. Lost races are retried a bounded number of times and counted. Changes of
one node that a process makes while its write to that node is in flight are written together, in
the order they were asked, by the next compare-and-set (each caller still gets its own answer).

Every read and write rides out a JetStream outage (a leader election, a reconnect) within the
call's window (``gpuledger_common.outage``). A write whose answer was lost is tried again with
the same bytes on the same revision: if the first one was applied, the second fails as a
conflict, and the message that took that revision's place says whether it was ours. So a write
is applied at most once, and never over a change it did not see (docs/ledger.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import logging
import random
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DeliverPolicy, KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from gpuledger_common.bus import SUBJECT_PREFIX, after_reply, encode
from gpuledger_common.jsacks import Acks
from gpuledger_common.keywatch import KeyWatch
from gpuledger_common.metrics import CAS_ATTEMPTS, CAS_CONFLICTS, CAS_GAVE_UP, LEDGER_YIELDS
from gpuledger_common.natsauth import LEDGER_YIELD
from gpuledger_common.outage import (
    ATTEMPT_S,
    MAX_BACKOFF_S,
    MIN_ATTEMPT_S,
    RETRY_S,
    Outage,
    OutageStats,
    outage_of,
    ride_out,
    time_left,
    within,
)
from gpuledger_core import codec
from gpuledger_core.errors import Conflict, GpuledgerError, InvalidArgument, Unavailable
from gpuledger_core.events import diff
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, tidy
from gpuledger_core.model import Allocation, Node, Owner

log = logging.getLogger(__name__)

WRITES_REMEMBERED = 8
PENDING_PAUSE_S = 0.005  # the first pause after a refusal that a write pending at the leader caused
CATCH_UP_S = 0.05  # after a lost race, how long a followed store waits for its watch to bring the winner
HOT_S = 1.0  # after losing a race on a key, an unfollowed store starts from a fresh read for this long
# Yielding a hot key (docs/ledger.md, "Several replicas"): a followed store that lost this many
# races in a row on a node asks the other writers (core NATS, LEDGER_YIELD, "<writer> <node>")
# to hold their next write to it until its write arrives (YIELD_S at most), and tries again after
# a short back-off.
YIELD_AFTER = 2
YIELD_S = 0.005  # at most: the pause ends when the other writer's write arrives
YIELD_BACKOFF_S = 0.001  # the first back-off after asking; it doubles with each further loss, as before
LEDGER_BUCKET = "gpuledger-ledger"
OWNER_BUCKET = "gpuledger-owners"
KEY_PREFIX = f"$KV.{LEDGER_BUCKET}."  # the subject of a ledger key, less the key
EVENTS_SUBJECT = f"{SUBJECT_PREFIX}.events"
Transition = Callable[[NodeLedger | None], NodeLedger | None]
T = TypeVar("T")
_OPEN, _COMMA = ord("["), ord(",")
SPLICE_FROM = 4  # the fewest allocations a node's last value must hold for its next to be read in pieces


def node_key(node: str) -> str:
    return f"node.{node}"


def owner_key(owner: Owner) -> str:
    return f"owner.{owner.kind.value}.{hashlib.sha256(owner.key.encode()).hexdigest()[:40]}"


@dataclass(slots=True)
class CasStats:
    attempts: int = 0
    conflicts: int = 0
    writes: int = 0
    gave_up: int = 0
    reads: int = 0  # fresh reads of a key that a write needed first


@dataclass(slots=True)
class Following:
    """A running ``follow_values``: ``failed`` holds why it stopped applying, if it did."""

    sub: Subscription | None = None
    failed: Exception | None = None

    async def stop(self) -> None:
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
            self.sub = None


@dataclass(slots=True)
class _Inventory:
    """One node's inventory, with its JSON as a value holds it: a value that begins with
    ``prefix`` carries this inventory, and a write splices ``fragment`` in."""

    node: Node
    json: bytes
    prefix: bytes = field(init=False)
    fragment: orjson.Fragment = field(init=False)

    def __post_init__(self) -> None:
        self.prefix = b'{"schema":%d,"node":' % codec.SCHEMA + self.json + b',"allocations":'
        self.fragment = orjson.Fragment(self.json)


@dataclass(slots=True)
class _Part:
    """One allocation of a node's value, with its JSON as decoded or encoded here; ``json`` is
    ``raw`` as ``encode`` spells it (made when first needed)."""

    allocation: Allocation
    raw: object
    fragment: orjson.Fragment | None = None
    json: bytes | None = None

    def encoded(self) -> bytes:
        if self.json is None:
            self.json = encode(self.raw)
        return self.json


@dataclass(slots=True, eq=False)
class _Turn:
    """One caller's change of a node's ledger, queued behind the write to that node in flight."""

    transition: Transition
    attempts: int
    done: asyncio.Future[Written]
    context: contextvars.Context  # the caller's, with its outage window
    deadline: float  # when that window ends (``time.monotonic``)
    refused: BaseException | None = None  # what the transition raised on the batch's last value
    dropped: bool = False  # answered already: out of the batch's later attempts


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """Which allocation an owner holds, as the owner index says; ``at`` is the writer's clock."""

    allocation: AllocationId
    node: NodeName
    revision: int
    at: float


@dataclass(frozen=True, slots=True)
class Written:
    old: NodeLedger | None
    new: NodeLedger | None
    revision: int


@dataclass(slots=True)
class LedgerStore:
    nc: Client
    kv: KeyValue
    owners: KeyValue
    max_attempts: int = 12
    clock: Callable[[], float] = time.time
    records_expire: bool = False  # the server drops owner records at their TTL (see ``open``)
    retry_s: float = RETRY_S  # how long a call waits out a JetStream outage (``outage.within`` narrows it)
    catch_up_s: float = CATCH_UP_S  # after a lost race, how long a followed store waits for its watch
    stats: CasStats = field(default_factory=CasStats)
    written_up_to: int = 0  # the bucket's sequence at this process's latest ledger write (or below it)
    outage: OutageStats = field(default_factory=OutageStats)
    _jetstream: JetStreamContext | None = None
    _publishing: set[asyncio.Future[None]] = field(default_factory=set)  # events on their way out
    _queued: dict[str, list[_Turn]] = field(default_factory=dict)  # changes waiting for the write ahead
    _batches: dict[str, asyncio.Task[Any]] = field(default_factory=dict)  # the write in flight, per node
    _known: dict[str, tuple[NodeLedger | None, int]] = field(default_factory=dict)
    _contended: dict[str, float] = field(default_factory=dict)  # when a write to the key last lost a race
    _written: dict[str, dict[bytes, NodeLedger]] = field(default_factory=dict)  # our last writes, by their bytes
    _inventory: dict[str, _Inventory] = field(default_factory=dict)  # each node's inventory, with its JSON
    _parts: dict[str, dict[object, _Part]] = field(default_factory=dict)  # each node's allocations, with their JSON
    _newer: dict[str, int] = field(default_factory=dict)  # nodes whose value is of a newer schema: read, not written
    _foreign: dict[str, float] = field(default_factory=dict)  # when another process's write of the key last arrived
    _advanced: dict[str, asyncio.Event] = field(default_factory=dict)  # set when a newer value of the key is known
    _followed: bool = False  # a watch feeds ``remember`` (``follow_values``): the known values are current
    yield_s: float = YIELD_S  # how long a write to a node is held when another writer asks
    _writer: bytes = field(default_factory=lambda: secrets.token_hex(8).encode())  # names this store in yields
    _yield_until: dict[str, float] = field(default_factory=dict)  # a pause asked by another writer, per node
    _yield_again: dict[str, float] = field(default_factory=dict)  # no new pause before: at most every other window
    _yielding: set[str] = field(default_factory=set)  # nodes whose next write waits out a pause now
    _yield_sub: Subscription | None = None
    _acks: Acks | None = None

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
        js = nc.jetstream(timeout=ATTEMPT_S)
        outage = OutageStats()

        async def opened(what: str, work: Callable[[], Awaitable[T]]) -> T:
            return await ride_out(nc, what, work, retry_s, outage)

        kv = await opened(f"open bucket {LEDGER_BUCKET}", lambda: _bucket(js, LEDGER_BUCKET, replicas))
        owners = await opened(f"open bucket {OWNER_BUCKET}", lambda: _bucket(js, OWNER_BUCKET, replicas))
        store = cls(nc, kv, owners, max_attempts, retry_s=retry_s, outage=outage, _jetstream=js)
        if deny_rollups:
            await opened(f"deny rollups on bucket {LEDGER_BUCKET}", lambda: _deny_rollups(js, LEDGER_BUCKET))
            await opened(f"deny rollups on bucket {OWNER_BUCKET}", lambda: _deny_rollups(js, OWNER_BUCKET))
        if record_ttls:
            store.records_expire = await opened("allow per-message TTLs", lambda: _allow_ttl(js, OWNER_BUCKET))
            if not store.records_expire:
                log.warning("NATS keeps no per-message TTLs here (2.11+ does): owner records are deleted instead")
        return store

    @property
    def _js(self) -> JetStreamContext:
        if self._jetstream is None:
            self._jetstream = self.nc.jetstream(timeout=ATTEMPT_S)
        return self._jetstream

    async def _stored(self, subject: str, data: bytes, headers: dict[str, str]) -> int:
        """Publish to a bucket's stream; the sequence its ack names (``jsacks``). A conditional
        write the stream refuses is a lost race (``KeyWrongLastSequenceError``, with the
        refusal's words, which may name the revision now)."""
        if self._acks is None:
            self._acks = Acks(self.nc)
        try:
            return await self._acks.publish(subject, data, headers, ATTEMPT_S)
        except APIError as err:
            if err.err_code in (10071, 10164) or "wrong last sequence" in str(err):
                raise KeyWrongLastSequenceError(description=err.description) from err
            raise

    async def _ride_out(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, tried again through a JetStream outage until this call's window ends."""
        return await ride_out(self.nc, what, attempt, self.retry_s, self.outage)

    async def _cas(
        self, what: str, bucket: str, key: str, data: bytes, revision: int, put: Callable[[], Awaitable[int]]
    ) -> int:
        """``put()``, a compare-and-set of ``data`` on ``revision``, ridden out; its new revision.
        A put whose answer was lost (a timeout, a dropped connection) may have been applied:
        tried again, it then fails as a conflict, and the key's first message after
        ``revision`` (the write that took its place) says whether it was this one."""
        unsure = False

        async def attempt() -> int:
            nonlocal unsure
            try:
                return await put()
            except KeyWrongLastSequenceError:
                if unsure and (landed := await self._landed(bucket, key, revision, data)):
                    return landed
                raise
            except Exception as err:
                unsure = unsure or outage_of(err) is Outage.UNKNOWN
                raise
            except asyncio.CancelledError:  # cut off at the end of the window: it may have been applied
                unsure = True
                raise

        return await self._ride_out(what, attempt)

    async def _landed(self, bucket: str, key: str, revision: int, data: bytes) -> int:
        """The revision ``data`` was written at on top of ``revision``, or 0 if another write
        took that place (or it is no longer kept: the transition then runs on a fresh read)."""
        try:
            msg = await self._js.get_msg(f"KV_{bucket}", seq=revision + 1, subject=f"$KV.{bucket}.{key}", next=True)
        except NotFoundError:
            return 0
        return (msg.seq or 0) if msg.data == data else 0

    async def read(self, node: str) -> tuple[NodeLedger | None, int]:
        try:
            entry = await self._ride_out(f"read the ledger of {node}", lambda: self.kv.get(node_key(node)))
        except (KeyNotFoundError, KeyDeletedError):
            return None, 0
        except Unavailable:
            raise
        except Exception as err:
            raise Unavailable(f"cannot read the ledger of {node}: {err}") from err
        ledger = self._decoded(node, entry.value) if entry.value else None
        self.remember(node, ledger, entry.revision or 0)
        return ledger, entry.revision or 0

    def _decoded(self, node: str, data: bytes) -> NodeLedger:
        """The ledger in ``data``. Our own recent writes come back from a watch already decoded.
        The node's inventory, which seldom changes, is decoded once per change, and while the
        value begins with the same inventory bytes only its allocations are parsed."""
        mine = self._written.get(node, {}).get(data)  # the same bytes are the same value
        if mine is not None:
            self._newer.pop(node, None)
            return mine
        inventory = self._inventory.get(node)
        if inventory is not None and data.startswith(inventory.prefix) and data.endswith(b"}"):
            self._newer.pop(node, None)  # the prefix holds our schema
            spliced = self._spliced(node, data, len(inventory.prefix))
            if spliced is not None:
                return NodeLedger(inventory.node, self._allocations_from(node, *spliced))
            try:
                items = orjson.loads(data[len(inventory.prefix) : -1])
            except orjson.JSONDecodeError:  # more follows the allocations: read the whole value
                items = None
            if isinstance(items, list):
                return NodeLedger(inventory.node, self._allocations_from(node, items))
        raw = _json(data)
        if not isinstance(raw, dict) or not isinstance(raw.get("node"), dict):
            return codec.ledger_from(raw)  # says what is wrong
        schema = codec.schema_of(raw)
        if schema > codec.SCHEMA:  # read as far as this code knows it; never written back
            if self._newer.get(node) != schema:
                log.warning("the ledger of %s is in schema %d, newer than this one's %d", node, schema, codec.SCHEMA)
            self._newer[node] = schema
        else:
            self._newer.pop(node, None)
        json = encode(raw["node"])
        if inventory is None or inventory.json != json:
            inventory = self._inventory[node] = _Inventory(codec.node_from(codec.Reader(raw).obj("node")), json)
        return NodeLedger(inventory.node, self._allocations_from(node, raw.get("allocations")))

    def _spliced(self, node: str, data: bytes, at: int) -> tuple[list[object], list[_Part], list[_Part]] | None:
        """A value's allocations (its array starts at ``data[at]``): the items parsed, and the
        node's last parts unchanged before them and after them.

        Another writer's change adds, changes or drops one or two allocations: the last value's
        parts whose bytes follow one another from the front of the array, or from its back, are
        kept (those not found there were dropped or changed), and only the bytes between them
        are parsed. None when they do not line up, or when the last value held fewer than
        ``SPLICE_FROM`` (parsing a short array whole costs less): the whole array is read."""
        parts = self._parts.get(node)
        if parts is None or len(parts) < SPLICE_FROM or data[at] != _OPEN or not data.endswith(b"]}"):
            return None
        last = list(parts.values())  # in the order of the value they came in
        content = data[at + 1 : -2]  # the items between the array's brackets, comma separated
        size, head, start, after = len(content), [], 0, 0
        for i, part in enumerate(last):  # from the front
            json = part.encoded()
            end = start + len(json)
            if content.startswith(json, start) and (end == size or (end < size and content[end] == _COMMA)):
                head.append(part)
                start, after = end + 1, i + 1
        tail, end = [], size
        for part in reversed(last[after:]):  # from the back, among those after the front's
            json = part.encoded()
            begin = end - len(json)
            if begin >= start and content.endswith(json, begin, end) and (begin == 0 or content[begin - 1] == _COMMA):
                tail.append(part)
                end = begin - 1
        tail.reverse()
        if end == start - 1:  # nothing between: allocations were only dropped
            return [], head, tail
        middle = content[start:end] if end > start else b""
        try:
            items = orjson.loads(b"[" + middle + b"]")
        except orjson.JSONDecodeError:
            return None
        if not isinstance(items, list) or not items:  # "[]": two commas with nothing between
            return None
        return items, head, tail

    def _allocations_from(
        self,
        node: str,
        items: object,
        head: list[_Part] | None = None,
        tail: list[_Part] | None = None,
    ) -> tuple[Allocation, ...]:
        """Decoded allocations: ``head``, then ``items``, then ``tail``. Those of the node's last
        value, decoded or written here, are reused when their JSON is equal: another writer's
        change touches one or two of them."""
        if items is None:
            items = []
        if not isinstance(items, list):
            raise InvalidArgument("allocations", f"must be a list, got {type(items).__name__}")
        before = self._parts.get(node, {})
        now: dict[object, _Part] = {}
        order = list(head or ())
        for item in items:
            part = before.get(item.get("id")) if isinstance(item, dict) else None
            if part is None or part.raw != item:
                part = _Part(codec.allocation_from(codec.Reader(item, f"allocations[{len(order)}]")), item)
            order.append(part)
        order.extend(tail or ())
        for part in order:
            now[part.allocation.id] = part
        self._parts[node] = now
        return tuple(part.allocation for part in order)

    def remember(self, node: str, ledger: NodeLedger | None, revision: int) -> None:
        """Note a value of the node's key seen elsewhere (a watch), if it is newer than ours.

        ``mutate`` starts from the newest value it knows instead of reading the key again; a
        stale one only costs a failed compare-and-set and a fresh read.
        """
        if revision >= self._known.get(node, (None, 0))[1]:
            self._known[node] = (ledger, revision)
            if any(ledger is mine for mine in self._written.get(node, {}).values()):
                self._foreign.pop(node, None)  # one of our writes (they decode to themselves)
            elif ledger is not None:
                self._foreign[node] = time.monotonic()
                if node in self._yielding:  # the writer that asked got in: the pause has done its work
                    self._resume(node)
            event = self._advanced.pop(node, None)
            if event is not None:
                event.set()

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
        with within(self.retry_s):  # the read, the write and any retries: one outage window
            return await self._mutate_in_turn(node, transition, attempts or self.max_attempts)

    async def _mutate_in_turn(self, node: str, transition: Transition, attempts: int) -> Written:
        """Queue the change; the next write to the node takes it with every change queued beside it.
        With no write to the node in flight, none queued and no pause asked, the change is a batch of
        one, written from the caller's own task (``_mutate_now``)."""
        if not (self._held_up(node) or node in self._yield_until or self._queued.get(node)):
            return await self._mutate_now(node, transition, attempts)
        done = asyncio.get_running_loop().create_future()
        turn = _Turn(transition, attempts, done, contextvars.copy_context(), time.monotonic() + time_left(self.retry_s))
        turn.done.add_done_callback(_retrieved)
        self._queued.setdefault(node, []).append(turn)
        self._next_batch(node)
        try:  # the writes ahead may be waiting out an outage: wait for them within this call's window
            async with asyncio.timeout(max(time_left(self.retry_s), MIN_ATTEMPT_S)):
                return await asyncio.shield(turn.done)
        except TimeoutError:
            if self._unqueued(node, turn):
                raise Unavailable(
                    f"cannot write the ledger of {node}: the writes to it ahead of this one are still waiting "
                    "out a JetStream outage"
                ) from None
        except asyncio.CancelledError:
            self._unqueued(node, turn)
            raise
        # A write has taken the change; it ends within the shortest window of its batch, this
        # call's or an earlier one, and then answers (a last request may take ATTEMPT_S).
        try:
            async with asyncio.timeout(ATTEMPT_S):
                return await asyncio.shield(turn.done)
        except TimeoutError:
            raise Unavailable(
                f"cannot write the ledger of {node}: no answer within the call's window (the write may still "
                "be applied)"
            ) from None

    async def _mutate_now(self, node: str, transition: Transition, attempts: int) -> Written:
        """The change written by the caller's task, as the write in flight to the node: changes asked
        meanwhile queue behind it, and the next batch starts when it ends. A task of its own for the
        write, with the future, shield and timeouts around waiting on it, took 47 of the 162 us of
        CPU a lone write cost (docs/ledger.md). A caller cancelled meanwhile hears of it as it did
        from the queue; the write may land, and a watch brings it (or the next write reads it)."""
        task = asyncio.current_task()
        assert task is not None
        self._batches[node] = task
        try:
            return await self._mutate(node, transition, attempts)
        finally:
            self._batch_done(node)

    def _unqueued(self, node: str, turn: _Turn) -> bool:
        """Take a change no write has taken yet out of the queue; False if one has."""
        queue = self._queued.get(node, [])
        if turn not in queue:
            return False
        queue.remove(turn)
        return True

    def _next_batch(self, node: str) -> None:
        """Start writing the node's queued changes, unless a write to it is in flight. The batch
        runs in the context of the caller with the least time left, so it rides out an outage
        for as long as that caller's window lasts (a caller with time left after it is queued
        again: each call waits out as much as its own window allows)."""
        if self._held_up(node) or not self._queued.get(node):
            return
        pause = self._yield_until.pop(node, 0.0) - time.monotonic()
        if pause > 0:  # another writer keeps losing races on the node: let it write first
            self._yielding.add(node)
            asyncio.get_running_loop().call_later(pause, self._resume, node)
            return
        turns = self._queued.pop(node)
        context = min(turns, key=lambda t: t.deadline).context
        batch = asyncio.get_running_loop().create_task(self._write_batch(node, turns), context=context)
        self._batches[node] = batch
        batch.add_done_callback(lambda _: self._batch_done(node))

    def _held_up(self, node: str) -> bool:
        """A write to the node is in flight, or its next one waits out a pause another writer asked."""
        return node in self._batches or node in self._yielding

    def _resume(self, node: str) -> None:
        self._yielding.discard(node)
        self._next_batch(node)

    async def _asked_to_yield(self, msg: Msg) -> None:
        """Another writer lost races on a node in a row: hold the next write to it until a write of
        another process arrives from the watch, or for ``yield_s`` at most.
        Only for a node this store knows, not asked by itself, and not again until as long again
        has passed after the pause: a writer that asks and asks cannot hold this one up for more
        than half the time."""
        writer, _, raw = msg.data.partition(b" ")
        node = raw.decode(errors="replace")
        now = time.monotonic()
        if writer == self._writer or node not in self._known or now < self._yield_again.get(node, 0.0):
            return
        self._yield_until[node] = now + self.yield_s
        self._yield_again[node] = now + 2 * self.yield_s
        LEDGER_YIELDS.labels("taken").inc()

    async def _ask_to_yield(self, node: str) -> None:
        LEDGER_YIELDS.labels("asked").inc()
        with contextlib.suppress(Exception):  # a hint: a write never depends on it
            await self.nc.publish(LEDGER_YIELD, self._writer + b" " + node.encode())

    def _batch_done(self, node: str) -> None:
        self._batches.pop(node, None)
        self._next_batch(node)

    async def _write_batch(self, node: str, turns: list[_Turn]) -> None:
        """One compare-and-set with every turn's transition applied in order. A transition that
        raises leaves the value as it found it and gets its own error; a turn whose attempts
        are used up by lost races gets ``Conflict`` while the others go on."""

        def combined(ledger: NodeLedger | None) -> NodeLedger | None:
            value, live = ledger, [t for t in turns if not t.dropped]
            for turn in live:
                try:
                    value, turn.refused = turn.transition(value), None
                except Exception as err:
                    turn.refused = err
            first = next((t.refused for t in live if t.refused is not None), None)
            if first is not None and all(t.refused is not None for t in live):
                raise first  # nothing to write: every caller gets its own error
            return value

        def lost(attempt: int) -> bool:
            for turn in turns:
                if not turn.dropped and turn.attempts <= attempt:
                    turn.dropped = True
                    _answer(turn, Conflict(f"the ledger of {node} kept changing; gave up after {attempt} attempts"))
            return any(not t.dropped for t in turns)

        try:
            written = await self._mutate(node, combined, max(t.attempts for t in turns), lost)
        except BaseException as err:
            again = []
            for turn in turns:
                if turn.dropped:
                    continue
                if isinstance(err, Unavailable) and turn.refused is None and turn.deadline > time.monotonic():
                    again.append(turn)  # the outage outlasted a shorter window than this call's
                    continue
                _answer(turn, turn.refused if isinstance(err, Exception) and turn.refused is not None else err)
            if again:
                self._queued[node] = again + self._queued.get(node, [])
            if not isinstance(err, Exception):
                raise
            return
        for turn in turns:
            if not turn.dropped:
                _answer(turn, turn.refused or written)

    def _hot(self, node: str) -> bool:
        """Another process wrote this key lately: our cached value is likely stale, so read first."""
        return time.monotonic() - self._contended.get(node, -HOT_S) < HOT_S

    def won_elsewhere(self, within_s: float) -> set[str]:
        """Nodes whose newest value another process wrote, arriving here within the last ``within_s``."""
        now = time.monotonic()
        return {node for node, at in self._foreign.items() if now - at < within_s}

    def crowded(self) -> set[str]:
        """Nodes this process is writing right now, or lost a race on to another process lately."""
        now = time.monotonic()
        hot = {node for node, at in self._contended.items() if now - at < HOT_S}
        return hot | set(self._batches)

    async def _caught_up(self, node: str, revision: int) -> tuple[NodeLedger | None, int] | None:
        """The node's value once a watch has brought revision ``revision`` (or a newer one), or None
        if none did within ``catch_up_s``."""
        deadline = time.monotonic() + self.catch_up_s
        while (known := self._known.get(node)) is None or known[1] < revision:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            event = self._advanced.setdefault(node, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await event.wait()
        return known

    async def _start_from(self, node: str, attempt: int, lost_to: int) -> tuple[NodeLedger | None, int] | None:
        """The value an attempt first tries the transition on, or None to read the key first.

        The first attempt starts from the newest value this process knows, which saves a read;
        without a watch feeding this store, not while the key is hot (another process won a
        race on it lately). After a lost race a followed store waits (``catch_up_s``) for its
        watch to bring the revision that won, which the refusal named, instead of reading the
        key: a read costs a JetStream request and a decode, the watch brings that value anyway.
        A value of a newer schema is checked again on a fresh read (it may have gone)."""
        if node in self._newer:
            return None
        if attempt > 1:
            return await self._caught_up(node, lost_to) if self._followed and lost_to else None
        return None if self._hot(node) and not self._followed else self._known.get(node)

    async def _mutate(
        self, node: str, transition: Transition, attempts: int, lost: Callable[[int], bool] | None = None
    ) -> Written:
        """``lost(attempt)`` hears of each lost race and says whether to go on."""
        lost_to = 0  # the revision that beat our last write, as its refusal named it
        attempt = pending = 0
        while attempt < attempts:
            attempt += 1
            # Only a write can prove a known value current: if the transition refuses it or
            # finds nothing to change, the verdict is taken again on a fresh read.
            known = await self._start_from(node, attempt, lost_to)
            tried = _try(transition, known, self.clock()) if known is not None else UNPROVEN
            if known is not None and not isinstance(tried, _Unproven):
                (current, revision), new = known, tried
            else:
                self.stats.reads += 1
                current, revision = await self.read(node)
                new = transition(tidy(current, self.clock()) if current is not None else None)
                if new == current:
                    return Written(current, current, revision)
            if node in self._newer:
                codec.check_writable(self._newer[node], f"the ledger of {node}")
            self.stats.attempts += 1
            CAS_ATTEMPTS.inc()
            try:
                written = await self._write(node, new, revision)
            except KeyWrongLastSequenceError as refusal:
                self.stats.conflicts += 1
                CAS_CONFLICTS.inc()
                self._contended[node] = time.monotonic()
                lost_to = _revision_now(refusal)
                if not lost_to and await self._pending_at_leader(
                    f"write the ledger of {node}", lambda: self._ledger_revision(node), revision, pending
                ):
                    attempt, lost_to, pending = attempt - 1, revision, pending + 1  # no race was lost
                    continue
                if attempt == attempts or (lost is not None and not lost(attempt)):
                    break
                # The back-off stays even when the watch brings the winner at once: without it the
                # process that just won, which knows its own write first, keeps winning (measured:
                # a release gave up after 12 attempts with two replicas and 16 clients). A followed
                # store that keeps losing asks the others to hold their next write to the node, and
                # so may try again sooner.
                if self._followed and attempt >= YIELD_AFTER:
                    await self._ask_to_yield(node)
                    await asyncio.sleep(random.uniform(0, min(0.2, YIELD_BACKOFF_S * 2 ** (attempt - YIELD_AFTER))))
                else:
                    await asyncio.sleep(random.uniform(0, min(0.2, 0.002 * 2**attempt)))
                continue
            self.stats.writes += 1
            self.written_up_to = max(self.written_up_to, written)
            self.remember(node, new, written)
            # The events are not part of the caller's answer: a request handler sends its answer
            # first (``bus.after_reply``); elsewhere they go out as soon as this call returns.
            publish = functools.partial(self._start_publishing, current, new, written)
            if not after_reply(publish):
                publish()
            return Written(current, new, written)
        if attempts >= self.max_attempts:  # a caller that asked for fewer tries moves on: no give-up
            self.stats.gave_up += 1
            CAS_GAVE_UP.inc()
        raise Conflict(f"the ledger of {node} kept changing; gave up after {attempts} attempts")

    async def _pending_at_leader(
        self, what: str, revision_now: Callable[[], Awaitable[int]], revision: int, waited: int
    ) -> bool:
        """After a refusal that names no revision ("wrong last sequence"): True, after a pause, when
        the key is still at ``revision`` (``revision_now()`` reads it). Then no other write won:
        the stream's leader holds a write to the key that it has not committed yet (another
        writer's, still being replicated), or cannot commit (a leader that lost its quorum refuses
        every later conditional write to the key until it steps down). That is waited out within
        the call's window, as an outage is, and refused as ``Unavailable`` once the window is over."""
        if await revision_now() != revision:
            return False
        pause = random.uniform(0.5, 1.0) * min(MAX_BACKOFF_S, PENDING_PAUSE_S * 2**waited)
        if time_left(self.retry_s) <= pause:
            raise Unavailable(
                f"cannot {what}: the stream's leader holds an earlier write to it that it "
                "cannot commit (has the JetStream cluster lost its quorum?)"
            )
        await asyncio.sleep(pause)
        return True

    async def _ledger_revision(self, node: str) -> int:
        return (await self.read(node))[1]

    async def _write(self, node: str, new: NodeLedger | None, revision: int) -> int:
        key = node_key(node)
        what = f"write the ledger of {node}"
        try:
            if new is None:
                return await self._ride_out(what, lambda: self._delete(key, revision))
            data = self._encoded(new)
            # Noted before the write: its watch entry may arrive before the write's own answer.
            recent = self._written.setdefault(node, {})
            recent[data] = new
            while len(recent) > WRITES_REMEMBERED:
                del recent[next(iter(recent))]  # dicts keep insertion order: the oldest goes
            return await self._cas(what, LEDGER_BUCKET, key, data, revision, lambda: self._put(key, data, revision))
        except (KeyWrongLastSequenceError, Unavailable):
            raise
        except Exception as err:
            raise Unavailable(f"cannot write the ledger of {node}: {err}") from err

    async def _put(self, key: str, data: bytes, revision: int) -> int:
        try:
            if revision == 0:
                return await self.kv.create(key, data)
            headers = {"Nats-Expected-Last-Subject-Sequence": str(revision)}
            return await self._stored(f"{KEY_PREFIX}{key}", data, headers)
        except KeyWrongLastSequenceError:
            raise
        except APIError as err:
            if "wrong last sequence" in str(err) or "key exists" in str(err):  # ``create``'s refusals
                raise KeyWrongLastSequenceError(description=err.description) from err
            raise

    async def _delete(self, key: str, revision: int) -> int:
        """Delete a node's key on ``revision``. Tried again after a lost answer, a delete that was
        applied fails as a conflict, and the transition runs again on the deleted key."""
        try:
            await self.kv.delete(key, last=revision)
        except APIError as err:
            if "wrong last sequence" in str(err):
                raise KeyWrongLastSequenceError() from err
            raise
        return revision + 1

    def _encoded(self, ledger: NodeLedger) -> bytes:
        """The ledger's bytes, as ``codec.ledger_to`` spells it. Parts already encoded for an
        earlier write are reused: the node's inventory, and each allocation that is the same
        object as before (they are immutable; a write changes one or two of them)."""
        name = ledger.node.name
        inventory = self._inventory.get(name)
        if inventory is None or (inventory.node is not ledger.node and inventory.node != ledger.node):
            inventory = self._inventory[name] = _Inventory(ledger.node, encode(codec.node_to(ledger.node)))
        before = self._parts.get(name, {})
        now: dict[object, _Part] = {}
        for a in ledger.allocations:
            part = before.get(a.id)
            if part is None or part.allocation is not a:
                part = _Part(a, codec.allocation_to(a))
            if part.fragment is None:
                part.fragment = orjson.Fragment(part.encoded())
            now[a.id] = part
        self._parts[name] = now
        parts = [part.fragment for part in now.values()]
        return encode({"schema": codec.SCHEMA, "node": inventory.fragment, "allocations": parts})

    def _start_publishing(self, old: NodeLedger | None, new: NodeLedger | None, revision: int) -> None:
        publishing = asyncio.ensure_future(self._publish(old, new, revision))
        self._publishing.add(publishing)
        publishing.add_done_callback(self._publishing.discard)

    async def _publish(self, old: NodeLedger | None, new: NodeLedger | None, revision: int) -> None:
        for event in diff(old, new, revision):
            try:
                subject = f"{EVENTS_SUBJECT}.{event.node}"
                await self.nc.publish(subject, encode(codec.event_to(event)))
            except Exception as err:  # the write stands; watchers also see the key change
                log.warning("could not publish %s event for %s: %s", event.kind, event.node, err)

    async def nodes(self) -> dict[NodeName, tuple[NodeLedger, int]]:
        """Every node's ledger as it is now."""
        found: dict[NodeName, tuple[NodeLedger, int]] = {}
        async for node, ledger, revision in self.snapshot():
            if ledger is not None:
                found[node] = (ledger, revision)
        return found

    async def snapshot(self) -> AsyncIterator[tuple[NodeName, NodeLedger | None, int]]:
        """Every node's current value (None: deleted) and revision.

        It ends once every key the bucket held when it began has arrived (the keys are asked of
        the stream first). Neither the client's end-of-snapshot marker nor the messages' pending
        counts can be trusted for that when the machine is busy.
        """
        try:
            keys = await self._ride_out("list the ledger's nodes", self._keys_now)
            if not keys:
                return
            watcher = await self._ride_out("watch the ledger", lambda: self.kv.watch("node.>"))
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
                node = NodeName(entry.key.removeprefix("node."))
                yield node, self.watched_value(node, entry.value, entry.operation), entry.revision or 0
                keys.discard(entry.key)
                if not keys:
                    return
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]

    async def _next_entry(self, watcher: KeyValue.KeyWatcher) -> KeyValue.Entry | None:
        """The watch's next entry, within the call's outage window, or ``retry_s`` outside one (a
        stream that lost its leader mid-snapshot sends nothing more)."""
        wait = max(time_left(self.retry_s), MIN_ATTEMPT_S)
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
            keys = await self._ride_out("list the ledger's nodes", self._keys_now)
        except Unavailable:
            raise
        except Exception as err:
            raise Unavailable(f"cannot list the ledger's nodes: {err}") from err
        return sorted(NodeName(key.removeprefix("node.")) for key in keys)

    async def _keys_now(self) -> set[str]:
        """The node keys the bucket holds now: a snapshot is complete once all have arrived."""
        info = await self._js.stream_info(f"KV_{LEDGER_BUCKET}", subjects_filter=f"{KEY_PREFIX}node.>")
        return {subject.removeprefix(KEY_PREFIX) for subject in (info.state.subjects or {})}

    def watched_value(self, node: str, data: bytes | None, operation: str | None) -> NodeLedger | None:
        """A key's value as a watch delivers it: None for a deleted (or purged) key. Decoded as
        ``read`` decodes (the node's inventory once per change, unchanged allocations reused)."""
        return None if operation in ("DEL", "PURGE") or not data else self._decoded(node, data)

    def key_watch(
        self, node: str | None, deliver: Callable[[Msg], None], lost: Callable[[], None] = lambda: None
    ) -> KeyWatch:
        """A watch (not started) of the node's key, or of every node's key with None
        (``keywatch``: it says when its consumer is gone within seconds, calling ``lost``)."""
        subject = f"{KEY_PREFIX}{node_key(node) if node is not None else 'node.>'}"
        return KeyWatch(self.nc, self._js, f"KV_{LEDGER_BUCKET}", subject, deliver, lost)

    async def follow_values(
        self, apply: Callable[[NodeName, NodeLedger | None, int], None], caught_up: Callable[[], None]
    ) -> Following:
        """Call ``apply`` for every node's current value, then ``caught_up`` (once every key the
        bucket held has arrived, as ``snapshot`` decides it), then for every change, from the
        subscription's own callback: no queue and no task between a change and ``apply``. The
        returned handle says whether it failed, and stops it."""
        following = Following()
        try:
            if self._yield_sub is None:  # once per store: a follower that starts again keeps it
                self._yield_sub = await self.nc.subscribe(LEDGER_YIELD, cb=self._asked_to_yield)
            keys = await self._keys_now()
            if not keys:
                caught_up()

            async def on_msg(msg: Msg) -> None:
                if following.failed is not None:
                    return
                try:
                    key = msg.subject.removeprefix(KEY_PREFIX)
                    node = NodeName(key.removeprefix("node."))
                    operation = msg.header.get("KV-Operation") if msg.header else None
                    apply(node, self.watched_value(node, msg.data, operation), stream_sequence(msg))
                    if keys:
                        keys.discard(key)
                        if not keys:
                            caught_up()
                except Exception as err:  # a value that cannot be read: the follower starts again
                    following.failed = err

            following.sub = await self._js.subscribe(
                f"{KEY_PREFIX}node.>",
                stream=f"KV_{LEDGER_BUCKET}",
                cb=on_msg,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                inactive_threshold=300.0,
            )
        except Exception as err:
            raise Unavailable(f"cannot watch the ledger: {err}") from err
        self._followed = True  # from now on the known values are the watch's (see ``_start_from``)
        return following

    # --- the owner index: one allocation per owner, whichever replica got there first ---

    async def owner_of(self, owner: Owner) -> tuple[AllocationId, NodeName, int] | None:
        record = await self.owner_record(owner)
        return None if record is None else (record.allocation, record.node, record.revision)

    async def owner_record(self, owner: Owner) -> OwnerRecord | None:
        try:
            entry = await self._ride_out("read the owner index", lambda: self.owners.get(owner_key(owner)))
        except (KeyNotFoundError, KeyDeletedError):
            return None
        except Unavailable:
            raise
        except Exception as err:
            raise Unavailable(f"cannot read the owner index: {err}") from err
        if not entry.value:
            return None
        raw = _json(entry.value, "owner record")
        if not isinstance(raw, dict):
            return None
        if not (isinstance(raw.get("allocation"), str) and isinstance(raw.get("node"), str)):
            raise InvalidArgument("owner record", "needs the allocation and node it names")
        at = raw.get("at")
        return OwnerRecord(
            AllocationId(raw["allocation"]),
            NodeName(raw["node"]),
            entry.revision or 0,
            float(at) if isinstance(at, (int, float)) else 0.0,
        )

    async def claim_owner(
        self, owner: Owner, allocation: AllocationId, node: str, revision: int = 0, ttl_s: float | None = None
    ) -> int | None:
        """Record ``allocation`` as the owner's: a new record (``revision`` 0) or a change of the
        record at ``revision``; with ``ttl_s`` the server drops the record after that long.
        Returns the record's new revision, or None if someone else's record is in the way."""
        key = owner_key(owner)
        data = encode({"allocation": allocation, "node": node, "owner": owner.key, "at": self.clock()})
        with within(self.retry_s):
            return await self._claim(key, data, revision, ttl_s)

    async def _claim(self, key: str, data: bytes, revision: int, ttl_s: float | None) -> int | None:
        try:
            try:
                return await self._put_owner(key, data, revision, ttl_s)
            except KeyWrongLastSequenceError:
                if revision:
                    return None
                # A new record where an old one was deleted: the delete marker is the last revision.
                try:
                    await self._ride_out("read the owner index", lambda: self.owners.get(key))
                except (KeyNotFoundError, KeyDeletedError) as gone:  # deleted (it has an entry), or expired
                    entry = getattr(gone, "entry", None)
                    return await self._put_owner(key, data, (entry.revision or 0) if entry else 0, ttl_s)
                return None
        except KeyWrongLastSequenceError:
            return None
        except Unavailable:
            raise
        except Exception as err:
            raise Unavailable(f"cannot write the owner index: {err}") from err

    async def _put_owner(self, key: str, data: bytes, revision: int, ttl_s: float | None) -> int:
        """Write the owner's record on ``revision``. A refusal that names no revision, with the
        record still at ``revision``, lost no race: it is waited out (``_pending_at_leader``)."""
        subject = f"$KV.{OWNER_BUCKET}.{key}"
        headers = {"Nats-Expected-Last-Subject-Sequence": str(revision)}

        async def put() -> int:
            return await self._stored(subject, data, {**headers, **_ttl(ttl_s)})

        waited = 0
        while True:
            try:
                return await self._cas("write the owner index", OWNER_BUCKET, key, data, revision, put)
            except KeyWrongLastSequenceError as refusal:
                if _revision_now(refusal) or not await self._pending_at_leader(
                    "write the owner index", lambda: self._owner_revision(key), revision, waited
                ):
                    raise
                waited += 1

    async def _owner_revision(self, key: str) -> int:
        """The owner record's revision: of its last write, or of the marker that deleted it; 0 if none."""
        try:
            entry = await self._ride_out("read the owner index", lambda: self.owners.get(key))
        except (KeyNotFoundError, KeyDeletedError) as gone:
            found = getattr(gone, "entry", None)
            return (found.revision or 0) if found is not None else 0
        return entry.revision or 0

    async def forget_owner_of(self, owner: Owner, allocation_id: AllocationId) -> None:
        """Drop the owner's record if it still names ``allocation_id`` (so the owner may
        allocate anew once that allocation is released)."""
        record = await self.owner_of(owner)
        if record is not None and record[0] == allocation_id:
            await self.forget_owner(owner, record[2])

    async def forget_owner(self, owner: Owner, revision: int) -> None:
        """Drop the owner's record if it is still the one read at ``revision`` (tried again after
        a lost answer, a delete that was applied fails as a conflict: the record is gone)."""
        try:
            await self._ride_out("write the owner index", lambda: self.owners.delete(owner_key(owner), last=revision))
        except KeyWrongLastSequenceError:
            pass
        except Unavailable:
            raise
        except Exception as err:
            if "wrong last sequence" not in str(err):
                raise Unavailable(f"cannot write the owner index: {err}") from err


async def _bucket(js: JetStreamContext, name: str, replicas: int) -> KeyValue:
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        pass
    except Exception as err:
        _unless_outage(err, f"cannot open bucket {name}")
    config = KeyValueConfig(bucket=name, history=5, storage=StorageType.FILE, replicas=replicas)
    try:
        return await js.create_key_value(config)
    except Exception as err:
        _unless_outage(err, f"cannot create bucket {name}")


async def _allow_ttl(js: JetStreamContext, name: str) -> bool:
    """Let owner records carry a TTL (a bucket made elsewhere may lack per-message TTLs); False
    when the server does not know them (before 2.11 it ignores the setting)."""
    try:
        info = await js.stream_info(f"KV_{name}")
        if not info.config.allow_msg_ttl:
            info.config.allow_msg_ttl = True
            info = await js.update_stream(info.config)
    except Exception as err:
        _unless_outage(err, f"cannot allow per-message TTLs on bucket {name}")
    return bool(info.config.allow_msg_ttl)


async def _deny_rollups(js: JetStreamContext, name: str) -> None:
    """Make the bucket's stream refuse messages with a ``Nats-Rollup`` header (nothing of ours
    purges a key; a rollup of ``all`` on one key empties the bucket)."""
    try:
        info = await js.stream_info(f"KV_{name}")
        if info.config.allow_rollup_hdrs:
            info.config.allow_rollup_hdrs = False
            await js.update_stream(info.config)
    except Exception as err:
        _unless_outage(err, f"cannot deny rollups on bucket {name}")


def _unless_outage(err: Exception, what: str) -> NoReturn:
    """Let an outage through to be ridden out; anything else is ``Unavailable`` at once."""
    if outage_of(err) is not None:
        raise err
    raise Unavailable(f"{what}: {err}") from err


class _WatchEnded(Exception):
    """A watcher stopped before the snapshot was complete."""


def _answer(turn: _Turn, result: Written | BaseException) -> None:
    if turn.done.done():
        return
    if isinstance(result, asyncio.CancelledError):
        turn.done.cancel()
    elif isinstance(result, BaseException):
        turn.done.set_exception(result)
    else:
        turn.done.set_result(result)


def _retrieved(done: asyncio.Future[Written]) -> None:
    """An answer nobody waits for any more (the caller's window ended) is not an unhandled error."""
    if not done.cancelled():
        done.exception()


class _Unproven:
    """A transition's verdict on a possibly stale value: to be taken again on a fresh read."""


UNPROVEN = _Unproven()


def _try(
    transition: Transition, known: tuple[NodeLedger | None, int], now: float
) -> NodeLedger | _Unproven | None:
    """The transition's result on a value that may be stale, or ``UNPROVEN`` when it refused or
    changed nothing (neither verdict may be trusted before a fresh read)."""
    current = known[0]
    try:
        new = transition(tidy(current, now) if current is not None else None)
    except GpuledgerError:
        return UNPROVEN
    return UNPROVEN if new == current else new


def stream_sequence(msg: Msg) -> int:
    """A delivered JetStream message's stream sequence (a key's revision), read from its reply
    subject as ``msg.metadata`` reads it, without building the rest of the metadata: the watch of
    the ledger reads one per change. ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>...``
    (9 tokens), or with the domain and account hash after ``ACK`` (12 or more)."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9:
        return int(tokens[5])
    if len(tokens) >= 12:
        return int(tokens[7])
    return msg.metadata.sequence.stream  # not a JetStream delivery: nats-py says what is wrong


def _ttl(ttl_s: float | None) -> dict[str, str]:
    """The header that gives a message its own TTL, in whole seconds (as nats-py writes it)."""
    return {} if ttl_s is None else {"Nats-TTL": str(int(ttl_s))}


def _revision_now(lost: KeyWrongLastSequenceError) -> int:
    """The key's revision as the refusal of a compare-and-set names it ("wrong last sequence: 7"),
    or 0 when it does not."""
    found = re.search(r"wrong last sequence: (\d+)", str(getattr(lost, "description", "") or ""))
    return int(found.group(1)) if found else 0


def _json(data: bytes, what: str = "ledger value") -> object:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise InvalidArgument(what, f"not valid JSON: {err}") from err
