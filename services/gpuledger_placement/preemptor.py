"""Share-aware preemption: placement chooses the victims and evicts them itself (docs/preemption.md),
for classic pods and for the claims DRA mode C allocates (``consider_claim``: the claim planned as
a pod it owns; claims mode C allocated, and claims kube-scheduler allocated and the ledger
committed (mode B), are victims too, through their pods: a mode-B claim's allocation vetoed first,
``claim_veto``), and, where it is on and nobody of lower priority helps, defragmentation
(``repacker``: movable pods moved elsewhere instead).

kube-scheduler's own preemption cannot do it: it asks an extender about victims only after its dry
run found some, and that dry run counts a node's ``gpuledger.io/gpu`` slots, not what each holder
holds of which card. So when filter finds no node for a pod that wants cards, it hands the pod to
this preemptor (``consider``), which, once per pod at a time and at most every ``RETRY_S``:

1. takes the pod as the scheduler sent it: unbound, not ``preemptionPolicy: Never``, holding
   nothing yet, and with no preemption of ours under way (the ``gpuledger.io/preemption``
   annotation, younger than its hold); its priority as admission resolved it;
2. takes the nodes filter refused for want of cards (not those that can never fit), keeps those
   where evicting every pod holding cards there that may be of lower priority (not known yet, or
   known lower: a pod's priority never changes, so the last listing's is kept) would make room,
   and lists their pods (``preemption_holders``): each holder's priority, start and
   PodDisruptionBudget (protected when a budget selecting it allows no disruption now);
3. chooses the victims (``gpuledger_core.preemption.choose``: the smallest set of lower-priority
   holders on the cards the pod needs, and, where the node's free CPU or memory (the view's, where
   Kubernetes is followed) would still not take the pod, the further holders there its host needs,
   on the node where they all cost least: a room kube-scheduler's NodeResourcesFit then refuses is
   no room);
4. reads the pod afresh (the same checks again) and writes the annotation with the victims, with
   the pod's resourceVersion as precondition (of two placement replicas, one preempts);
5. holds the part of the room that is free already with a fence (``preempt_room``), and gives
   up where the room is no longer there once the victims go or the fence cannot be written
   (nobody is evicted for nothing); then
   evicts each victim through the Eviction API, so that PodDisruptionBudgets are the API server's
   to enforce; an eviction refused (a budget, the API server busy) stops the preemption with an
   Event on the pod, and it is tried again later, never forced;
6. in one compare-and-set on the node's ledger, releases the victims' entries and the fence, and
   reserves the pod's cards there for ``hold_s`` (the room held: filter sees the node fit the pod
   that holds it, and no one else fits there), and records the pod as the reservation's owner;
   then marks the annotation held. A hold that fails releases the fence.

The pod's bind then takes the held reservation, once every victim's pod is gone (``Binder``): no
card is used by a victim in its grace period and the pod at once. kube-scheduler counts an
extender's refusal as a rejection by its stand-in plugin "Extender", which any cluster event
requeues: the victims' deletion, and the annotation marked held (a victim without a grace period
may be gone before the hold is written, and its deletion requeued the pod too early). A
held room that is not bound within ``hold_s`` lapses like any reservation; a preemptor that dies
between the evictions and the hold leaves victims that go and room that is free again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuledger_common.store import LedgerStore
from gpuledger_core.claim_asks import ClaimAsk
from gpuledger_core.claim_placement import claim_as_pods
from gpuledger_core.errors import Conflict, GpuledgerError, NotFound
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, OwnerKind
from gpuledger_core.pods import PodAsk
from gpuledger_core.preemption import MOVED_FOR, PREEMPTED_BY, Fit, HostFree, Victims, choose
from gpuledger_core.repack import Repack, repack
from gpuledger_placement import claim_veto, preemption_holders
from gpuledger_placement.claims import DRIVER
from gpuledger_placement.convert import pod_ask_from
from gpuledger_placement.host_fit import host_refusal
from gpuledger_placement.metrics import DEFRAG_MOVES, PREEMPTIONS
from gpuledger_placement.pod_events import pod_event
from gpuledger_placement.preempt_room import release_fence, write_fence, write_hold
from gpuledger_placement.preemption_holders import CLAIMS, DEFAULT_GRACE_S, PDBS, holder_of, pod_ref, priority_of
from gpuledger_placement.preemption_note import PREEMPTION_ANNOTATION, Preemption, preemption_of
from gpuledger_placement.repacker import MOVABLE_LABEL, Defrag
from gpuledger_placement.service import PlacementService

log = logging.getLogger(__name__)
HOLD_S = 120.0  # the room held for the pod, at least; longer when a victim's grace period is
RETRY_S = 10.0  # a pod's preemption tried again at most this often
# The announcement's writes a change of the pod refuses before it gives up. kube-scheduler writes the
# pod's status (PodScheduled False) just as its filter call starts a preemption: a refusal for that
# alone once ended the attempt, and the pod waited for kube-scheduler to try it again (minutes).
ANNOUNCE_TRIES = 3
EVENT_REPEAT_S = 60.0
MERGE_PATCH = "application/merge-patch+json"


class PreemptApi(Protocol):
    async def get_object(self, path: str) -> dict[str, Any]: ...
    async def list_objects(self, path: str, params: Mapping[str, str]) -> dict[str, Any]: ...
    async def create_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def patch_object(self, path: str, body: Any, content_type: str) -> dict[str, Any]: ...
    async def replace_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(slots=True)
class Preemptor:
    api: PreemptApi
    store: LedgerStore
    service: PlacementService
    clock: Callable[[], float] = time.time
    hold_s: float = HOLD_S
    retry_s: float = RETRY_S
    _busy: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _tried: dict[str, float] = field(default_factory=dict)  # pod uid -> when its last preemption began
    _told: dict[tuple[str, str], float] = field(default_factory=dict)  # (pod uid, reason) -> when said
    _graces: dict[str, float] = field(default_factory=dict)  # pod uid -> its termination grace period (s)
    _priorities: dict[str, int] = field(default_factory=dict)  # pod or claim uid -> its priority, as last listed
    _consumers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # claim uid -> its pods (ns/name/uid)
    _mode_b: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # claim uid -> the mode-B claim listed
    preempting: bool = True  # setting ``preemption``: off leaves defragmentation alone (``defrag``)
    defrag: Defrag | None = None  # defragmentation's limits, where it is on (``repacker``)
    _moving_pods: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # pod uid -> the pod being moved

    def consider(
        self, raw: Mapping[str, Any], pod: PodAsk, refused: Iterable[str], alternatives: Sequence[PodAsk] = ()
    ) -> None:
        """Filter found no node for ``pod`` (``raw`` as the scheduler sent it); ``refused``: the
        nodes it refused for want of cards. Preempt for it in the background, unless under way or
        tried less than ``retry_s`` ago (for the first of ``pod`` and its ``alternatives``, other
        asks of the same owner, that victims can make room for). A pod with MIG asks preempts (or
        moves) the holders of the placements it needs (their instances, made on demand, are
        destroyed for it when it starts; docs/mig.md)."""
        uid = pod.owner.id
        nodes = tuple(refused)
        if not pod.wants_cards or not nodes or uid in self._busy:
            return
        if self.clock() - self._tried.get(uid, float("-inf")) < self.retry_s:
            return
        self._tried[uid] = self.clock()
        self._busy[uid] = asyncio.create_task(self._guarded(raw, pod, nodes, tuple(alternatives)))

    def consider_claim(self, raw: Mapping[str, Any], ask: ClaimAsk, nodes: Iterable[str]) -> None:
        """Mode C found no node for the claim ``ask`` of the gated pod ``raw`` (``nodes``: those
        its pod's host takes): preempt for it as for a classic pod, the claim planned as a pod that
        the claim owns, with its pod's priority: for the first combination of its ``firstAvailable``
        choices, in the claim's order, that victims can make room for; requests that must share an
        NVLink group get cards that do, or no victims."""
        asked = pod_ask_from(raw)
        first, *others = claim_as_pods(ask, asked.cpu_milli, asked.memory_mib)
        self.consider(raw, first, nodes, others)

    async def stop(self) -> None:
        for task in tuple(self._busy.values()):
            task.cancel()
        await asyncio.gather(*self._busy.values(), return_exceptions=True)

    async def idle(self) -> None:
        while self._busy:
            await asyncio.gather(*list(self._busy.values()), return_exceptions=True)

    async def _guarded(
        self, raw: Mapping[str, Any], pod: PodAsk, nodes: tuple[str, ...], alternatives: tuple[PodAsk, ...]
    ) -> None:
        try:
            await self.preempt(raw, pod, nodes, alternatives)
        except GpuledgerError as err:
            log.warning("preemption for %s failed: %s; tried again later", pod.owner.describe(), err)
        finally:
            self._busy.pop(pod.owner.id, None)
            self._forget_old()

    def _forget_old(self) -> None:
        now = self.clock()
        for uid in [u for u, at in self._tried.items() if now - at > 10 * self.retry_s]:
            del self._tried[uid]
        for key in [k for k, at in self._told.items() if now - at > EVENT_REPEAT_S]:
            del self._told[key]
        if not self._busy:
            self._graces.clear()
            self._moving_pods.clear()
            self._mode_b.clear()

    async def preempt(
        self, raw: Mapping[str, Any], pod: PodAsk, nodes: Sequence[str], alternatives: Sequence[PodAsk] = ()
    ) -> Victims | None:
        """Steps 1-6 above; the victims evicted and the room held, or None (nothing done). The
        victims are chosen for ``pod``, else for the first of ``alternatives`` (asks of the same
        owner, in its order of preference) they can make room for; moves, where no victims can, likewise."""
        meta = raw.get("metadata") or {}
        if not self._may_preempt(raw, pod):  # the scheduler's copy first: most pods stop here, unread
            return None
        priority = priority_of(raw)
        asks = [self.service.resolve(a) for a in (pod, *alternatives)]
        pod, fit = asks[0], self._fit(asks[0])
        victims: Victims | None = None
        listings = preemption_holders.Listings(self.api)  # read once in this attempt
        for ask in asks if self.preempting else ():
            ledgers = self._ledgers(nodes, ask, fit, priority)
            if ledgers:
                holders = await preemption_holders.holders(self, [ledger.node.name for ledger in ledgers], listings)
                victims = choose(ledgers, ask, priority, holders, fit, self.clock(), self._hosts(ledgers))
            if victims is not None:
                pod = ask
                break
        moving = None
        if victims is None and self.defrag is not None:
            found = await self._repack(raw, asks, priority, nodes, fit, listings)
            if found is not None:
                pod, moving = found
                victims = _as_victims(moving)
        if victims is None:
            log.debug("preemption for %s: no set of lower-priority (or movable) pods frees its cards",
                      pod.owner.describe())  # fmt: skip
            return None
        if not victims.evict:
            return None  # it fits now: kube-scheduler's next try places it
        for _ in range(ANNOUNCE_TRIES):  # the pod changed meanwhile: read again and decide again
            fresh = await self._pod(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))
            if fresh is None or not self._may_preempt(fresh, pod) or priority_of(fresh) != priority:
                return None  # gone, bound, another replica preempts for it, or its priority changed
            if await self._announce(fresh, victims):
                break
        else:
            return None
        vetoed = [self._mode_b[a.owner.id] for a in victims.evict if a.owner.id in self._mode_b]
        by = f"preempted by pod {meta.get('namespace')}/{meta.get('name')}: its cards are held for that pod"
        if not await claim_veto.veto(self.api, vetoed, DRIVER, by, self.clock()):
            await self._withdraw(fresh)  # a victim's claim changed since it was listed: tried again later
            return None
        try:
            fenced = await write_fence(self.store, self.service.view, self._fit(pod), pod, victims, self.clock(),
                                       self._hold_for(victims))  # fmt: skip
        except GpuledgerError as err:  # taken since the choice, or the store away: nobody is evicted
            log.info("preemption for %s: no fence: %s; tried again later", pod.owner.describe(), err)
            await claim_veto.restore(self.api, vetoed, DRIVER)
            await self._withdraw(fresh)
            return None
        if not await self._evict(fresh, victims, moving):
            await release_fence(self.store, self.service.view, victims.node, fenced, self.clock())
            await claim_veto.restore(self.api, vetoed, DRIVER)
            await self._withdraw(fresh)
            return None
        holder = f"{meta.get('namespace')}/{meta.get('name')}"
        why = f"{MOVED_FOR if moving is not None else PREEMPTED_BY}pod {holder}"
        await write_hold(self.store, self.service.view, self._fit(pod), pod, victims, holder, why, fenced,
                         self.clock(), self._hold_for(victims))  # fmt: skip
        await self._held(fresh, victims)
        cards = ",".join(str(s.index) for g in victims.grants for s in g.cards)
        hold = f"card(s) {cards} held for the pod for {self._hold_for(victims):g}s"
        if moving is not None:
            await self._event(fresh, "GpuledgerDefragmenting", f"moved {moving.describe()}; {hold}", kind="Normal")
            log.info(
                "defragmentation for %s: moved %s; room held on %s", pod.owner.describe(), moving.describe(), cards
            )
            return victims
        PREEMPTIONS.labels("held").inc()
        names = ", ".join(a.owner.describe() for a in victims.evict)
        await self._event(fresh, "GpuledgerPreempting", f"evicted {names} on {victims.node}; {hold}", kind="Normal")
        log.info("preemption for %s: evicted %s; room held on %s", pod.owner.describe(), victims.describe(), cards)
        return victims

    async def _repack(
        self,
        raw: Mapping[str, Any],
        asks: Sequence[PodAsk],
        priority: int,
        nodes: Sequence[str],
        fit: Fit,
        listings: preemption_holders.Listings,
    ) -> tuple[PodAsk, Repack] | None:
        """Defragmentation (``repacker``), for a pod preemption cannot help: the fewest movable pods
        to move (within the budget) so that the first of ``asks`` (the pod's, then its claim's later
        choices) that any can make room for fits on one of ``nodes``, each moved pod fitting elsewhere."""
        assert self.defrag is not None
        budget = self.defrag.budget()
        if budget <= 0:
            log.info("defragmentation for %s: the budget of moves is spent for now", asks[0].owner.describe())
            return None
        listed = await self.api.list_objects("/api/v1/pods", {"labelSelector": f"{MOVABLE_LABEL}=true"})
        budgets = await listings.items(PDBS)
        mine = str((raw.get("metadata") or {}).get("uid"))
        pods = [p for p in listed.get("items") or [] if str((p.get("metadata") or {}).get("uid")) != mine]
        claims = await self._claims_of(pods, listings)
        movable, raws = self.defrag.movable(pods, priority, lambda p: holder_of(p, budgets), claims)
        if not movable:
            return None
        view, hosts = self.service.view, self.service.hosts

        def host(allocation: Allocation, node: NodeName) -> bool:
            moved = raws.get(allocation.owner.id)
            return moved is not None and not host_refusal(moved, hosts, view)(node)

        targets, ledgers = {NodeName(n) for n in nodes}, view.fresh_ledgers()
        for ask in asks:
            found = repack(ledgers, ask, movable, fit, self.clock(), budget, host, targets)
            if found is not None:
                break
        else:
            return None
        for move in found.moves:
            moved = raws[move.allocation.owner.id]
            meta = moved.get("metadata") or {}
            grace = (moved.get("spec") or {}).get("terminationGracePeriodSeconds")
            self._graces[move.allocation.owner.id] = float(grace) if isinstance(grace, int) else DEFAULT_GRACE_S
            self._moving_pods[str(meta.get("uid"))] = moved
            if move.allocation.owner.kind is OwnerKind.CLAIM:  # the claim goes with its pod
                self._consumers[move.allocation.owner.id] = (pod_ref(meta["namespace"], meta["name"], meta["uid"]),)
        return ask, found

    async def _claims_of(
        self, pods: Sequence[Mapping[str, Any]], listings: preemption_holders.Listings
    ) -> list[Mapping[str, Any]]:
        """The cluster's claims, where one of ``pods`` uses a claim (a classic cluster's do not, and
        its placement may not list claims: ``deploy/kubernetes/dra`` grants that); read once in
        the attempt (the choice of victims may have read them already)."""
        if not any((p.get("status") or {}).get("resourceClaimStatuses") for p in pods):
            return []
        try:
            return list(await listings.items(CLAIMS))
        except GpuledgerError as err:  # not granted, or the API server away: their claims stay put
            log.warning("defragmentation: cannot list claims (%s); pods holding cards by claims are not moved", err)
            return []

    def _may_preempt(self, raw: Mapping[str, Any], pod: PodAsk) -> bool:
        spec, meta = raw.get("spec") or {}, raw.get("metadata") or {}
        if spec.get("nodeName") or meta.get("deletionTimestamp"):
            return False
        if spec.get("preemptionPolicy") == "Never":
            return False  # as Kubernetes defines: the pod waits, it never preempts
        if pod.owner.key in self.service.view.holders:
            return False  # it holds its room already (an earlier preemption, a bind under way)
        under_way = preemption_of(raw)
        return under_way is None or self.clock() - under_way.at >= max(self.hold_s, under_way.hold_s)

    def _fit(self, pod: PodAsk) -> Fit:
        _, policy = self.service.policies.get(pod.policy or self.service.policy)
        view = self.service.view
        return Fit(policy, view.slots_per_card, view.mix_isolation)

    def _ledgers(self, nodes: Sequence[str], pod: PodAsk, fit: Fit, priority: int) -> list[NodeLedger]:
        """The nodes' ledgers where evicting every pod holding cards that could be of lower
        priority (its priority not known yet, or known and lower) would make room."""
        view, found = self.service.view, []
        for name in nodes:
            entry = view.entries.get(name)
            if entry is None or view.stale(name):
                continue
            held = [a for a in entry.ledger.live() if a.owner.kind in (OwnerKind.POD, OwnerKind.CLAIM)]
            lower = [a.id for a in held if self._priorities.get(a.owner.id, priority - 1) < priority]
            if lower and fit.grants(entry.ledger, pod, lower) is not None:
                found.append(entry.ledger)
        return found

    def _hosts(self, ledgers: Sequence[NodeLedger]) -> dict[NodeName, HostFree]:
        """The nodes' free CPU and memory where placement follows them (kube-scheduler's count of
        requests); a node it does not follow is left to kube-scheduler."""
        found = {}
        for ledger in ledgers:
            known = self.service.view.hosts(str(ledger.node.name))
            if known is not None:
                found[ledger.node.name] = HostFree(known[0], known[1])
        return found

    def _pods_of(self, victim: Allocation) -> tuple[str, ...]:
        """The pods (namespace/name/uid) to evict for ``victim``: itself, or its claim's pods."""
        if victim.owner.kind is OwnerKind.CLAIM:
            return self._consumers.get(victim.owner.id, ())
        return (pod_ref(victim.owner.namespace, victim.owner.name, victim.owner.id),)

    def _note(self, victims: Victims, held: bool = False) -> Preemption:
        refs = tuple(ref for a in victims.evict for ref in self._pods_of(a))
        return Preemption(victims.node, self.clock(), self._hold_for(victims), refs, held)

    async def _announce(self, raw: Mapping[str, Any], victims: Victims) -> bool:
        meta = raw["metadata"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"],
                             "annotations": {PREEMPTION_ANNOTATION: self._note(victims).encode()}}}  # fmt: skip
        try:
            await self.api.patch_object(_pod_path(meta["namespace"], meta["name"]), body, MERGE_PATCH)
        except (Conflict, NotFound):
            return False
        return True

    async def _held(self, raw: Mapping[str, Any], victims: Victims) -> None:
        """The annotation says the room is held. This update of the pod is also what has
        kube-scheduler try it again now: a victim whose pod went before the hold was written (no
        grace period) requeued it too early, and the hold itself is no Kubernetes event (an
        extender's refusal makes any event of the pod's requeue it)."""
        meta = raw["metadata"]
        body = {"metadata": {"annotations": {PREEMPTION_ANNOTATION: self._note(victims, held=True).encode()}}}
        try:
            await self.api.patch_object(_pod_path(meta["namespace"], meta["name"]), body, MERGE_PATCH)
        except GpuledgerError as err:  # the victims' deletion requeues it, or kube-scheduler's own flush
            log.warning("preemption for pod %s/%s: not marked held: %s", meta["namespace"], meta["name"], err)

    async def _withdraw(self, raw: Mapping[str, Any]) -> None:
        meta = raw["metadata"]
        body = {"metadata": {"annotations": {PREEMPTION_ANNOTATION: None}}}
        try:
            await self.api.patch_object(_pod_path(meta["namespace"], meta["name"]), body, MERGE_PATCH)
        except GpuledgerError as err:  # it lapses after hold_s anyway
            log.warning("preemption for pod %s/%s: annotation not removed: %s", meta["namespace"], meta["name"], err)

    async def _evict(self, raw: Mapping[str, Any], victims: Victims, moving: Repack | None = None) -> bool:
        """Evict every victim (each a pod moved elsewhere, with ``moving``); False (with an Event)
        at the first the API server refuses."""
        meta = raw["metadata"]
        destinations = {m.allocation.owner.id: m.to for m in moving.moves} if moving is not None else {}
        for allocation in victims.evict:
            to = destinations.get(allocation.owner.id, "another node")
            cards = ",".join(sorted({str(s.index) for s in allocation.shares()}))
            held = f" (claim {allocation.owner.describe()})" if allocation.owner.kind is OwnerKind.CLAIM else ""
            for ref in self._pods_of(allocation):
                namespace, name, uid = ref.split("/")
                body = {"apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": name, "namespace": namespace},
                        "deleteOptions": {"preconditions": {"uid": uid}}}  # fmt: skip
                try:
                    await self.api.create_object(f"{_pod_path(namespace, name)}/eviction", body)
                except NotFound:
                    continue  # gone already
                except GpuledgerError as err:
                    (DEFRAG_MOVES if moving is not None else PREEMPTIONS).labels("eviction_refused").inc()
                    await self._event(raw, "GpuledgerPreemptionBlocked", f"the eviction of pod {namespace}/{name} "
                                      f"was refused ({err}); tried again later, never forced")  # fmt: skip
                    return False
                victim = {"metadata": {"namespace": namespace, "name": name, "uid": uid}}
                if moving is not None:  # each move counts against the budget, whatever follows
                    DEFRAG_MOVES.labels("moved").inc()
                    if self.defrag is not None:
                        self.defrag.moved([self._moving_pods.pop(uid, victim)])
                    await self._event(victim, "GpuledgerMoved", f"moved by defragmentation for pod {meta['namespace']}/"
                                      f"{meta['name']}, off card(s) {cards} of {victims.node}; it fits on "
                                      f"{to} (its controller recreates it)",
                                      kind="Normal")  # fmt: skip
                    continue
                PREEMPTIONS.labels("evicted").inc()
                await self._event(victim, "Preempted", f"by pod {meta['namespace']}/{meta['name']} on "
                                  f"{victims.node}, card(s) {cards}{held} (gpuledger)", kind="Normal")  # fmt: skip
        return True

    def _hold_for(self, victims: Victims) -> float:
        """``hold_s``, or longer where a victim's grace period (its pod may take that long to end)
        and a minute for the bind would not fit in it."""
        graces = [self._graces.get(a.owner.id, DEFAULT_GRACE_S) for a in victims.evict]
        return max([self.hold_s, *(g + 60.0 for g in graces)])

    async def _pod(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        try:
            found = await self.api.get_object(_pod_path(namespace, name))
        except NotFound:
            return None
        return found if (found.get("metadata") or {}).get("uid") == uid else None

    async def _event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str = "Warning") -> None:
        meta = pod["metadata"]
        key = (str(meta["uid"]), reason)
        if reason != "Preempted" and self.clock() - self._told.get(key, float("-inf")) < EVENT_REPEAT_S:
            return
        self._told[key] = self.clock()
        path, body = pod_event(pod, reason, message, kind, self.clock())
        try:
            await self.api.create_object(path, body)
        except GpuledgerError as err:
            log.warning("preemption: cannot record the event %s: %s", reason, err)
        log.info("preemption: pod %s/%s: %s: %s", meta["namespace"], meta["name"], reason, message)


def _as_victims(moving: Repack) -> Victims:
    """The pods to move, as the preemption steps take them (no cost: they are not compared)."""
    return Victims(moving.node, tuple(m.allocation for m in moving.moves), moving.grants, (0, 0, 0, 0, 0.0))


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"
