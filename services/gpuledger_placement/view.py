"""Placement's own view of the ledger, kept current by watching the bucket, plus node heartbeats.

Each node's entry holds its ledger, its ``NodeState`` for placement (converted once per revision,
kubelet slots counted with ``slots_per_card``) and a memo of answers computed from that revision: an
entry is replaced when the key changes, so nothing in the memo can outlive the value it was computed
from. A node whose key holds a value that cannot be read has no entry (nothing is placed there),
and ``unreadable`` says why, until a readable value arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from gpuledger_common.bus import SUBJECT_PREFIX, decode
from gpuledger_common.store import LedgerStore
from gpuledger_common.store.follow import follow
from gpuledger_core.codec import Reader
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.packing import NodeState, from_ledger

log = logging.getLogger(__name__)
HEARTBEATS = (f"{SUBJECT_PREFIX}.heartbeat.*", f"{SUBJECT_PREFIX}.inventory.*")
MEMO_LIMIT = 64  # answers kept per node revision (distinct pod shapes and policies)


@dataclass(slots=True)
class NodeEntry:
    ledger: NodeLedger
    revision: int
    state: NodeState
    memo: dict[int, object] = field(default_factory=dict)

    def remember(self, key: int, value: object) -> None:
        if len(self.memo) >= MEMO_LIMIT:
            self.memo.clear()
        self.memo[key] = value


@dataclass(slots=True)
class FleetView:
    store: LedgerStore | None
    stale_after_s: float = 30.0
    clock: Callable[[], float] = time.time
    slots_per_card: int = field(kw_only=True)  # kubelet slots per card: the plugin's setting
    mix_isolation: bool = field(default=False, kw_only=True)  # may mps and none tenants share a card
    entries: dict[str, NodeEntry] = field(default_factory=dict)
    heartbeats: dict[str, float] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = 0.0
    models: Counter[str] = field(default_factory=Counter)  # cards per model, fleet-wide
    memories: Counter[int] = field(default_factory=Counter)  # cards per memory size
    order: dict[str, int] = field(default_factory=dict)  # each node's place in ``entries``' order
    holders: dict[str, str] = field(default_factory=dict)  # owner key -> the node of its live allocation
    # Each node's CPU and memory (free, allocatable) where Kubernetes is followed (hosts.py); None: untracked.
    hosts: Callable[[str], tuple[int, int, int, int] | None] = field(default=lambda _: None, kw_only=True)
    unreadable: dict[str, str] = field(default_factory=dict)  # nodes whose ledger value cannot be read: why
    _subs: list[Subscription] = field(default_factory=list)
    _watchers: list[Callable[[str], None]] = field(default_factory=list)
    _added: Iterator[int] = field(default_factory=count)

    def watch(self, changed: Callable[[str], None]) -> None:
        """Call ``changed(node)`` after every change of a node's entry (added, replaced, removed)."""
        self._watchers.append(changed)

    async def run(self) -> None:
        """Follow the bucket until cancelled."""
        assert self.store is not None
        self.started_at = self.clock()
        await follow(self.store, self.apply, self.ready.set, unreadable=self.unreadable_value)

    def apply(self, node: NodeName, ledger: NodeLedger | None, revision: int) -> None:
        known = self.entries.get(node)
        if ledger is not None and known is not None and revision and revision <= known.revision:
            return  # older than what we have (our own write got here first)
        if self.store is not None:
            self.store.remember(node, ledger, revision)
        if self.unreadable and self.unreadable.pop(node, None) is not None:  # readable again (or gone)
            log.info("the ledger value of node %s can be read again", node)
        if known is not None:
            self._count(known.ledger, -1)
        if ledger is None:
            self.entries.pop(node, None)
            self.order.pop(node, None)
        else:
            if known is None:
                self.order[node] = next(self._added)
            self.entries[node] = NodeEntry(ledger, revision, self.state_of(node, ledger))
            self._count(ledger, 1)
        for changed in self._watchers:
            changed(node)

    def unreadable_value(self, node: NodeName, revision: int, why: str) -> None:
        """The node's key holds a value that cannot be read (``why``): its entry goes (its last
        readable value is not trusted: nothing is placed there, no pod is taken to hold an
        allocation there) until a readable value arrives."""
        self.unreadable[node] = why
        known = self.entries.pop(node, None)
        if known is not None:
            self._count(known.ledger, -1)
            self.order.pop(node, None)
        for changed in self._watchers:
            changed(node)

    def host_changed(self, node: str) -> None:
        """The node's CPU or memory changed (a pod bound or gone, the Node resized): its state is
        made again, and with it every answer computed from it."""
        known = self.entries.get(node)
        if known is None:
            return
        self.entries[node] = NodeEntry(known.ledger, known.revision, self.state_of(node, known.ledger))
        for changed in self._watchers:
            changed(node)

    def state_of(self, node: str, ledger: NodeLedger) -> NodeState:
        """The node's state for the policies: its ledger, and its host's CPU and memory where followed."""
        host = self.hosts(node)
        if host is None:
            return from_ledger(ledger, slots_per_card=self.slots_per_card, mix_isolation=self.mix_isolation)
        cpu_free, mem_free, cpu_total, mem_total = host
        return from_ledger(
            ledger,
            cpu_free=cpu_free,
            mem_free=mem_free,
            cpu_total=cpu_total,
            mem_total=mem_total,
            slots_per_card=self.slots_per_card,
            mix_isolation=self.mix_isolation,
        )

    def _count(self, ledger: NodeLedger, sign: int) -> None:
        for card in ledger.node.cards:
            self.models[card.model] += sign
            self.memories[card.memory_mib] += sign
        node = ledger.node.name
        for allocation in ledger.live():
            key = allocation.owner.key
            if sign > 0:
                self.holders[key] = node
            elif self.holders.get(key) == node:
                del self.holders[key]

    def entry(self, node: str) -> NodeEntry | None:
        return self.entries.get(node)

    # --- liveness: a node whose inventory service stopped talking gets nothing new ---

    async def listen(self, nc: Client) -> None:
        for subject in HEARTBEATS:
            self._subs.append(await nc.subscribe(subject, cb=self._on_heartbeat))

    async def stop_listening(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            raw = Reader(decode(msg.data))
            node = raw.obj("node").text("name") if isinstance(raw.raw.get("node"), dict) else raw.text("node")
        except GpuledgerError as err:
            log.debug("ignoring malformed message on %s: %s", msg.subject, err)
            return
        if msg.subject not in (f"{pattern[:-1]}{node}" for pattern in HEARTBEATS):  # a node speaks for itself only
            log.warning("ignoring a heartbeat of %s published on %s", node, msg.subject)
            return
        self.heartbeat(node, self.clock())

    def heartbeat(self, node: str, at: float) -> None:
        self.heartbeats[node] = max(at, self.heartbeats.get(node, 0.0))

    def stale(self, node: str, now: float | None = None) -> bool:
        """No heartbeat for ``stale_after_s`` (counted from this process's start if none yet)."""
        if not self.stale_after_s:
            return False
        now = self.clock() if now is None else now
        return now - self.heartbeats.get(node, self.started_at or now) > self.stale_after_s

    def fresh_ledgers(self) -> list[NodeLedger]:
        """The ledgers of the nodes not stale, by node name."""
        return [entry.ledger for name, entry in sorted(self.entries.items()) if not self.stale(name)]

    def card_memory(self) -> int:
        """The most common card memory size in the fleet (sizes memory shares for the workload)."""
        common = [size for size, n in self.memories.most_common(1) if n > 0]
        return common[0] if common else 0

    def card_models(self) -> dict[str, int]:
        """The fleet's cards per model (``default`` weighs the models against it)."""
        return {model: n for model, n in self.models.items() if n > 0}

    def known_models(self) -> frozenset[str]:
        return frozenset(model for model, n in self.models.items() if n > 0)
