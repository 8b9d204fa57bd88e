"""Shares over their grants (docs/audit.md): placement tells, and on request evicts, a pod whose
processes use more of a card's memory than the ledger granted it.

Each node's inventory publishes its cards' processes with their pods; the audit itself is the
core's (``gpuledger_core.status.audit``, the one the allocator's listing shows). For each pod over
its grant on a card an episode begins (it ends when the pod is back within, gone, or no longer
holds the card):

- a Warning Event ``GpuledgerOverGrant`` on the pod, once per episode, naming the node, card,
  granted and used MiB. Its name is made from the pod, the card and the inventory report that
  began the episode, so placement's replicas (each sees every report) write it once: the second
  create is refused as a conflict;
- with ``action`` ``evict``, once the episode is ``grace_s`` old, the pod is evicted through the
  Eviction API with its uid as precondition (PodDisruptionBudgets are the API server's to enforce;
  a refusal is tried again after a back-off doubling from ``first_backoff_s`` to ``max_backoff_s``;
  never forced, no pod is deleted), and a Warning ``GpuledgerOverGrantEvicted`` says why.

It follows the fleet view and the inventory reports, off the paths that place pods, and never
writes the ledger. Tools and DRA claims are not audited per holder (docs/audit.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from gpuledger_common.bus import SUBJECT_PREFIX, decode
from gpuledger_core.card_usage import Usage, usage_of
from gpuledger_core.codec import Reader
from gpuledger_core.errors import Conflict, GpuledgerError, NotFound
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import OwnerKind
from gpuledger_core.status import node_status
from gpuledger_placement.drainer import DrainApi
from gpuledger_placement.metrics import OVER_GRANT_ACTIONS
from gpuledger_placement.pod_events import pod_event

log = logging.getLogger(__name__)
INVENTORIES = f"{SUBJECT_PREFIX}.inventory.*"
OVER = "GpuledgerOverGrant"
EVICTED = "GpuledgerOverGrantEvicted"
ACTIONS = ("report", "evict")


@dataclass(frozen=True, slots=True)
class Over:
    """A pod using more of a card's memory than granted (its containers on the card together)."""

    node: str
    uuid: str
    index: int
    namespace: str
    name: str
    uid: str
    granted_mib: int
    used_mib: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.uid, self.uuid)

    def describe(self) -> str:
        return (f"uses {self.used_mib} MiB of card {self.index} ({self.uuid}) of node {self.node}, "
                f"granted {self.granted_mib} MiB")  # fmt: skip


def over_grants(ledger: NodeLedger, usage: Mapping[str, Usage]) -> list[Over]:
    """The node's pods over their grants, one per pod and card."""
    found: dict[tuple[str, str], Over] = {}
    for card in node_status(ledger, usage=usage).cards:
        for h in card.holders:
            if h.over and h.owner.kind is OwnerKind.POD and h.owner.namespace and h.owner.name:
                granted = sum(o.mem_mib for o in card.holders if o.owner == h.owner)
                over = Over(ledger.node.name, card.card.uuid, card.card.index, h.owner.namespace, h.owner.name,
                            h.owner.id, granted, h.used_mib or 0)  # fmt: skip
                found[over.key] = over
    return list(found.values())


@dataclass(slots=True)
class Episode:
    over: Over
    began: float  # this process's clock
    report_at: float  # the inventory report that showed it first (names its Event)
    told: bool = False
    done: bool = False  # evicted, or gone
    not_before: float = float("-inf")
    backoff: float = 0.0


@dataclass(slots=True)
class Auditor:
    api: DrainApi
    view: Any  # FleetView: ``entries``, ``watch``, ``ready``
    action: str = "report"
    grace_s: float = 300.0
    clock: Callable[[], float] = time.time
    first_backoff_s: float = 5.0
    max_backoff_s: float = 300.0
    episodes: dict[tuple[str, str], Episode] = field(default_factory=dict)
    usage: dict[str, tuple[float, dict[str, Usage]]] = field(default_factory=dict)  # node -> (report at, usage)
    _dirty: set[str] = field(default_factory=set)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def listen(self, nc: Client) -> Subscription:
        return await nc.subscribe(INVENTORIES, cb=self._on_inventory)

    async def _on_inventory(self, msg: Msg) -> None:
        try:
            r = Reader(decode(msg.data))
            node = r.obj("node").text("name")
            at = r.number("at", 0.0)
        except GpuledgerError as err:
            log.debug("audit: ignoring a malformed inventory on %s: %s", msg.subject, err)
            return
        if msg.subject != f"{INVENTORIES[:-1]}{node}":  # a node speaks for itself only
            return
        self.report(node, at, usage_of(r.raw.get("extra")))

    def report(self, node: str, at: float, usage: dict[str, Usage]) -> None:
        """A node's inventory report: its cards' processes."""
        self.usage[node] = (at, usage)
        self.changed(node)

    def changed(self, node: str) -> None:
        self._dirty.add(node)
        self._wake.set()

    async def run(self) -> None:
        """Look again at every node that changed, and act on the episodes that are due, until cancelled."""
        self.view.watch(self.changed)
        await self.view.ready.wait()
        while True:
            await self.sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._until_next())

    async def sweep(self) -> None:
        self._wake.clear()
        dirty, self._dirty = self._dirty, set()
        for node in dirty:
            self._audit(node)
        for episode in list(self.episodes.values()):
            await self._act(episode)

    def _audit(self, node: str) -> None:
        entry = self.view.entries.get(node)
        at, usage = self.usage.get(node, (0.0, {}))
        found = {o.key: o for o in (over_grants(entry.ledger, usage) if entry is not None else ())}
        for key in [k for k, e in self.episodes.items() if e.over.node == node and k not in found]:
            gone = self.episodes.pop(key).over
            log.info("audit: pod %s/%s is within its grant on card %s again (or gone)", gone.namespace, gone.name,
                     gone.uuid)  # fmt: skip
        for key, over in found.items():
            known = self.episodes.get(key)
            if known is None:
                self.episodes[key] = Episode(over, self.clock(), at)
            else:
                known.over = over  # the latest use, for the eviction's message

    def _until_next(self) -> float:
        now = self.clock()
        due = [max(e.began + self.grace_s, e.not_before) - now for e in self.episodes.values() if not e.done]
        return max(0.05, min([30.0, *(d for d in due if d > 0)]))

    async def _act(self, episode: Episode) -> None:
        if not episode.told:
            episode.told = True
            await self._tell(episode)
        if self.action != "evict" or episode.done:
            return
        now = self.clock()
        if now < episode.began + self.grace_s or now < episode.not_before:
            return
        await self._evict(episode)

    async def _tell(self, episode: Episode) -> None:
        over = episode.over
        if self.action == "evict":
            message = f"{over.describe()}; evicted if still over {self.grace_s:g}s after this was first seen"
        else:
            message = f"{over.describe()}; its neighbours on the card may run out (over-grant action report)"
        pod = {"metadata": {"namespace": over.namespace, "name": over.name, "uid": over.uid}}
        path, body = pod_event(pod, OVER, message, "Warning", self.clock())
        digest = hashlib.sha256(f"{over.uid}/{over.uuid}/{episode.report_at!r}".encode()).hexdigest()[:16]
        body["metadata"] = {"name": f"{over.name}.over-grant-{digest}", "namespace": over.namespace}
        log.warning("audit: pod %s/%s %s", over.namespace, over.name, over.describe())
        try:
            await self.api.create_object(path, body)
        except Conflict:
            return  # another replica recorded it
        except GpuledgerError as err:
            log.warning("audit: cannot record the event %s: %s", OVER, err)
            return
        OVER_GRANT_ACTIONS.labels("told").inc()

    async def _evict(self, episode: Episode) -> None:
        over = episode.over
        path = f"/api/v1/namespaces/{over.namespace}/pods/{over.name}"
        try:
            pod = await self.api.get_object(path)
        except NotFound:
            episode.done = True
            return
        except GpuledgerError as err:
            self._later(episode, err)
            return
        meta = pod.get("metadata") or {}
        if meta.get("uid") != over.uid or meta.get("deletionTimestamp"):
            episode.done = True  # another pod of that name now, or on its way out already
            return
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": over.name, "namespace": over.namespace},
                "deleteOptions": {"preconditions": {"uid": over.uid}}}  # fmt: skip
        try:
            await self.api.create_object(f"{path}/eviction", body)
        except (NotFound, Conflict):
            episode.done = True
            return
        except GpuledgerError as err:
            OVER_GRANT_ACTIONS.labels("refused").inc()
            self._later(episode, err)
            return
        episode.done = True
        OVER_GRANT_ACTIONS.labels("evicted").inc()
        log.warning("audit: evicted pod %s/%s: %s", over.namespace, over.name, over.describe())
        message = f"evicted: {over.describe()}, for more than {self.grace_s:g}s (over-grant action evict)"
        event_path, event = pod_event(pod, EVICTED, message, "Warning", self.clock())
        with contextlib.suppress(GpuledgerError):
            await self.api.create_object(event_path, event)

    def _later(self, episode: Episode, err: GpuledgerError) -> None:
        episode.backoff = min(self.max_backoff_s, 2 * episode.backoff) if episode.backoff else self.first_backoff_s
        episode.not_before = self.clock() + episode.backoff
        over = episode.over
        log.info("audit: the eviction of pod %s/%s was refused or failed (%s); tried again in %gs",
                 over.namespace, over.name, err, episode.backoff)  # fmt: skip
