"""Draining a failing card (docs/remediation.md, "Draining a card"): placement evicts every pod
holding a share of a card that its node's inventory published with ``remedy: drain``, so that the
inventory can reset and check it once the ledger shows it empty.

On every change of the fleet view (and a full pass every ``pass_s``), for each card with
``remedy is Remedy.DRAIN``, each live allocation holding a share of it is taken apart:

- a pod's allocation: that pod;
- a claim's (DRA): the pods in the claim's ``status.reservedFor``, the claim read afresh (by the
  namespace and name the ledger's owner carries, its uid checked) at most every ``pass_s``;
- a tool's: not placement's (the allocator tells its tools); counted in the Node's Event, left be.

Each pod is evicted through the Eviction API with its uid as precondition, so PodDisruptionBudgets
are the API server's to enforce: a refused eviction (429, a budget) is tried again after a back-off
doubling from ``first_backoff_s`` to ``max_backoff_s``, never forced (no pod is deleted). A pod
being deleted already, or evicted here once, is not evicted again; one not bound to the card's node
(a reservation whose bind has not happened) is looked at again later. A pod without a controller
(a bare or static pod) is evicted too, and its Event says nothing recreates it: the card is
failing and the pod cannot keep working on it. A pod that holds other cards as well is evicted
whole: its job cannot keep the failed card, and the others go with it.

Events: ``GpuledgerCardDrained`` (Warning) on each evicted pod, naming the node, the card's index,
uuid and why it fails; ``GpuledgerDrainBlocked`` once per pod whose eviction was refused; and
``GpuledgerDrainingCard`` on the Node once per card episode (until the card stops draining), with
how many holders are moved.

A MIG instance whose fault needs its holder moved (``MigInstance.remedy`` drain, docs/mig.md) is
drained the same way, alone: only the allocations holding that placement are taken apart, the
card's other instances and holders stay, and the Events name the instance and its fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuledger_core.errors import Conflict, GpuledgerError, NotFound
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Card, MigInstance, OwnerKind, Remedy
from gpuledger_placement.metrics import CARDS_DRAINING, DRAIN_EVICTIONS
from gpuledger_placement.pod_events import node_event, pod_event
from gpuledger_placement.repacker import controller_of
from gpuledger_placement.view import FleetView

log = logging.getLogger(__name__)
DRAINED = "GpuledgerCardDrained"
BLOCKED = "GpuledgerDrainBlocked"
DRAINING = "GpuledgerDrainingCard"
RETIRED = "GpuledgerCardRetired"
FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 300.0
PASS_S = 30.0
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


class DrainApi(Protocol):
    async def get_object(self, path: str) -> dict[str, Any]: ...
    async def create_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class DrainingCard:
    """A card to drain (or one MIG ``instance`` of it) and the live allocations holding it."""

    node: NodeName
    card: Card
    holders: tuple[Allocation, ...]
    instance: MigInstance | None = None

    @property
    def key(self) -> tuple[str, str]:
        at = self.instance
        return (self.node, self.card.uuid if at is None else f"{self.card.uuid}/{at.slot.profile}@{at.slot.start}")

    def describe(self) -> str:
        at = self.instance
        if at is not None:
            where = f"MIG instance {at.slot.profile}@{at.slot.start} ({at.uuid}) on card {self.card.index}"
            return f"{where} ({self.card.uuid}) of node {self.node} ({at.fault or 'unhealthy'})"
        why = self.card.health_reason or "unhealthy"
        return f"card {self.card.index} ({self.card.uuid}) of node {self.node} ({why})"


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod to evict, and the claim through which it holds the card (``namespace/name``), if any."""

    namespace: str
    name: str
    uid: str
    claim: str = ""


def draining(ledger: NodeLedger) -> list[DrainingCard]:
    """The node's cards whose remedy is drain, each with its live holders; and the MIG instances
    whose remedy is drain, each with the live holders of its placement."""
    found = []
    for card in ledger.node.cards:
        if card.remedy is Remedy.DRAIN:
            holders = tuple(a for a in ledger.live() if any(s.uuid == card.uuid for s in a.shares()))
            found.append(DrainingCard(ledger.node.name, card, holders))
            continue
        for at in card.instances:
            if at.remedy is Remedy.DRAIN:
                held = tuple(a for a in ledger.live() if any(s.uuid == card.uuid and s.mig == at.slot
                                                             for s in a.shares()))  # fmt: skip
                found.append(DrainingCard(ledger.node.name, card, held, at))
    return found


@dataclass(slots=True)
class Drainer:
    api: DrainApi
    view: FleetView
    clock: Callable[[], float] = time.time
    first_backoff_s: float = FIRST_BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S
    pass_s: float = PASS_S
    cards: dict[tuple[str, str], DrainingCard] = field(default_factory=dict)  # (node, uuid) -> draining card
    _dirty: set[str] = field(default_factory=set)  # nodes changed since the last sweep
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _scanned_at: float = float("-inf")  # the last full pass
    _not_before: dict[str, float] = field(default_factory=dict)  # pod or claim uid -> when to look again
    _backoff: dict[str, float] = field(default_factory=dict)  # pod uid -> its back-off after a refusal
    _going: set[str] = field(default_factory=set)  # pod uids evicted here or being deleted
    _blocked: set[str] = field(default_factory=set)  # pod uids told of a refusal
    _told: set[tuple[str, str]] = field(default_factory=set)  # cards whose Node Event was recorded
    retired: dict[tuple[str, str], tuple[str, Card]] = field(default_factory=dict)  # (node, uuid) -> node, card
    _told_retired: set[tuple[str, str]] = field(default_factory=set)  # retired cards whose Node Event was recorded
    _seen: set[str] = field(default_factory=set)  # uids looked at in this sweep
    _claim_pods: dict[str, list[PodRef]] = field(default_factory=dict)  # claim uid -> its pods, as last read

    def changed(self, node: str) -> None:
        """The fleet view's watcher: ``node``'s entry changed."""
        self._dirty.add(node)
        self._wake.set()

    async def run(self) -> None:
        """Sweep on every change of the view and every ``pass_s``, until cancelled."""
        self.view.watch(self.changed)
        await self.view.ready.wait()
        while True:
            await self.sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._until_next())

    async def sweep(self) -> None:
        """Evict every pod holding a draining card that is due."""
        self._wake.clear()
        self._rescan()
        self._seen = set()
        for card in list(self.cards.values()):
            await self._drain(card)
        for key, (node, retired) in list(self.retired.items()):
            if key not in self._told_retired:
                self._told_retired.add(key)
                await self._tell_retired(node, retired)
        self._forget()

    def _rescan(self) -> None:
        if self.clock() - self._scanned_at >= self.pass_s:
            self._scanned_at = self.clock()
            self._dirty.update(self.view.entries)
            self._dirty.update(node for node, _ in self.cards)
        dirty, self._dirty = self._dirty, set()
        self.cards = {key: card for key, card in self.cards.items() if key[0] not in dirty}
        self.retired = {key: found for key, found in self.retired.items() if key[0] not in dirty}
        for node in dirty:
            entry = self.view.entries.get(node)
            for card in draining(entry.ledger) if entry is not None else ():
                self.cards[card.key] = card
            for retired in entry.ledger.node.cards if entry is not None else ():
                if retired.remedy is Remedy.RETIRED:
                    self.retired[(node, retired.uuid)] = (node, retired)
        self._told &= set(self.cards)  # a card back (or gone) starts a new episode when it drains again
        self._told_retired &= set(self.retired)  # one returned by an operator is told of again if retired again
        CARDS_DRAINING.set(len(self.cards))

    def _until_next(self) -> float:
        now = self.clock()
        due = [at - now for at in self._not_before.values() if at > now]
        return max(0.01, min([self.pass_s, *due]))

    async def _drain(self, card: DrainingCard) -> None:
        refs: list[tuple[Allocation, PodRef]] = []
        tools = 0
        for allocation in card.holders:
            if allocation.owner.kind is OwnerKind.TOOL:
                tools += 1  # the allocator tells its tools
                continue
            refs += [(allocation, ref) for ref in await self._pods_of(allocation)]
        for allocation, ref in refs:
            await self._evict(card, allocation, ref)
        if card.key not in self._told:
            self._told.add(card.key)
            await self._tell_node(card, len(refs), tools)

    async def _pods_of(self, allocation: Allocation) -> list[PodRef]:
        owner = allocation.owner
        if owner.kind is OwnerKind.POD:
            return [PodRef(owner.namespace, owner.name, owner.id)] if owner.namespace and owner.name else []
        self._seen.add(owner.id)
        if self.clock() < self._not_before.get(owner.id, float("-inf")):
            return self._claim_pods.get(owner.id, [])
        self._not_before[owner.id] = self.clock() + self.pass_s  # its pods may change: read again later
        self._claim_pods[owner.id] = await self._read_claim(allocation)
        return self._claim_pods[owner.id]

    async def _read_claim(self, allocation: Allocation) -> list[PodRef]:
        owner = allocation.owner
        if not owner.namespace or not owner.name:
            log.warning("drain: %s has no namespace and name in the ledger; its pods are not found", owner.describe())
            return []
        try:
            claim = await self.api.get_object(CLAIMS.format(namespace=owner.namespace, name=owner.name))
        except NotFound:
            return []  # gone: the claims controller releases its entry
        except GpuledgerError as err:
            log.warning("drain: cannot read %s: %s; tried again later", owner.describe(), err)
            self._not_before[owner.id] = self.clock() + self.first_backoff_s
            return []
        return _reserved_for(claim, owner.id, f"{owner.namespace}/{owner.name}")

    async def _evict(self, card: DrainingCard, allocation: Allocation, ref: PodRef) -> None:
        self._seen.add(ref.uid)
        if ref.uid in self._going or self.clock() < self._not_before.get(ref.uid, float("-inf")):
            return
        try:
            pod = await self._pod(ref)
        except GpuledgerError as err:
            log.warning("drain: cannot read pod %s/%s: %s; tried again later", ref.namespace, ref.name, err)
            self._later(ref.uid)
            return
        if pod is None:
            self._gone(ref)
            return
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            self._going.add(ref.uid)  # on its way out already: not evicted again
            return
        if (pod.get("spec") or {}).get("nodeName") != card.node:
            self._not_before[ref.uid] = self.clock() + self.pass_s  # not running there (yet)
            return
        await self._evict_pod(card, allocation, ref, pod)

    async def _evict_pod(self, card: DrainingCard, allocation: Allocation, ref: PodRef, pod: dict[str, Any]) -> None:
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": ref.name, "namespace": ref.namespace},
                "deleteOptions": {"preconditions": {"uid": ref.uid}}}  # fmt: skip
        try:
            await self.api.create_object(f"{_pod_path(ref)}/eviction", body)
        except (NotFound, Conflict):  # gone, or another pod of that name now
            self._gone(ref)
            return
        except GpuledgerError as err:
            await self._refused(card, ref, pod, err)
            return
        DRAIN_EVICTIONS.labels("evicted").inc()
        self._going.add(ref.uid)
        self._backoff.pop(ref.uid, None)
        self._not_before.pop(ref.uid, None)
        log.info("drain: evicted pod %s/%s off %s", ref.namespace, ref.name, card.describe())
        await self._event(pod, DRAINED, _evicted_message(card, allocation, ref, pod))

    async def _refused(self, card: DrainingCard, ref: PodRef, pod: dict[str, Any], err: GpuledgerError) -> None:
        DRAIN_EVICTIONS.labels("refused").inc()
        delay = self._later(ref.uid)
        log.info("drain: the eviction of pod %s/%s was refused (%s); tried again in %gs", ref.namespace, ref.name,
                 err, delay)  # fmt: skip
        if ref.uid not in self._blocked:
            self._blocked.add(ref.uid)
            await self._event(pod, BLOCKED, f"{card.describe()} must be drained, but the eviction of this pod was "
                              f"refused ({err}); tried again with a back-off up to {self.max_backoff_s:g}s, never "
                              "forced")  # fmt: skip

    def _later(self, uid: str) -> float:
        """Look at the pod again after its back-off, doubled each time."""
        delay = min(self.max_backoff_s, 2 * self._backoff[uid]) if uid in self._backoff else self.first_backoff_s
        self._backoff[uid] = delay
        self._not_before[uid] = self.clock() + delay
        return delay

    def _gone(self, ref: PodRef) -> None:
        DRAIN_EVICTIONS.labels("gone").inc()
        self._going.add(ref.uid)

    def _forget(self) -> None:
        """Drop what is known of pods and claims no draining card holds any more."""
        seen = self._seen
        self._going &= seen
        self._blocked &= seen
        for book in (self._not_before, self._backoff, self._claim_pods):
            for uid in [u for u in book if u not in seen]:
                del book[uid]

    async def _pod(self, ref: PodRef) -> dict[str, Any] | None:
        try:
            found = await self.api.get_object(_pod_path(ref))
        except NotFound:
            return None
        return found if (found.get("metadata") or {}).get("uid") == ref.uid else None

    async def _tell_node(self, card: DrainingCard, pods: int, tools: int) -> None:
        message = f"{card.describe()} must be drained: moving {pods} pod(s) off"
        if tools:
            message += f"; {tools} tool holder(s) are told by the allocator"
        path, body = node_event(card.node, DRAINING, message, "Warning", self.clock())
        await self._create(path, body, DRAINING)
        log.info("drain: %s", message)

    async def _tell_retired(self, node: str, card: Card) -> None:
        """A Warning on the Node, once per retirement: the card stays out until an operator acts."""
        why = card.health_reason or "unhealthy"
        message = (f"card {card.index} ({card.uuid}) is retired until an operator acts ({why}); "
                   f"`gpuledger health --node {node}` shows its history")  # fmt: skip
        path, body = node_event(NodeName(node), RETIRED, message, "Warning", self.clock())
        await self._create(path, body, RETIRED)
        log.warning("drain: node %s: %s", node, message)

    async def _event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        path, body = pod_event(pod, reason, message, "Warning", self.clock())
        await self._create(path, body, reason)

    async def _create(self, path: str, body: Mapping[str, Any], reason: str) -> None:
        try:
            await self.api.create_object(path, body)
        except GpuledgerError as err:
            log.warning("drain: cannot record the event %s: %s", reason, err)


def _reserved_for(claim: Mapping[str, Any], uid: str, name: str) -> list[PodRef]:
    """The pods a claim is reserved for, if it is still the claim of ``uid``."""
    if (claim.get("metadata") or {}).get("uid") != uid:
        return []  # another claim of that name now: the one held is gone
    namespace = name.partition("/")[0]
    users = (claim.get("status") or {}).get("reservedFor") or []
    return [PodRef(namespace, str(r["name"]), str(r["uid"]), name) for r in users
            if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("name") and r.get("uid")]  # fmt: skip


def _evicted_message(card: DrainingCard, allocation: Allocation, ref: PodRef, pod: Mapping[str, Any]) -> str:
    message = f"evicted: {card.describe()} must be drained"
    if ref.claim:
        message += f"; the pod uses it through claim {ref.claim}"
    others = sorted({s.index for s in allocation.shares()} - {card.card.index})
    if others:
        message += f"; its card(s) {','.join(map(str, others))} on the node go with it"
    if controller_of(pod) is None:
        message += "; no controller recreates this pod"
    return message


def _pod_path(ref: PodRef) -> str:
    return f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}"
