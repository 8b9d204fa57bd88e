"""DRA mode C: the ledger allocates the claims of gated pods (docs/dra-mode-c.md).

A pod created with the scheduling gate ``gpuledger.io/allocate`` (added by the
MutatingAdmissionPolicy of ``deploy/kubernetes/dra/allocation-gate.yaml`` in opted-in namespaces)
waits for this controller. For each such pod, once every claim it names exists:

1. each claim that is not allocated yet and asks for gpuledger's mode-C DeviceClasses
   (``claim_asks``) is placed with the classic policy (``claim_placement``: the node where the
   pod's CPU and memory fit, the cards the policy picks), committed in the ledger with one
   compare-and-set (the claims controller's ``reserve``: the same entry mode B would record), given
   gpuledger's finalizer, and written as kube-scheduler writes an allocation (``claim_status``,
   with no binding conditions: kube-scheduler then binds at once). A write the API server refuses
   releases the ledger entry;
2. the gate is lifted (a JSON patch whose ``test`` makes sure it removes that gate, no other).

A claim mode C does not allocate (``InvalidArgument``: a CEL selector in the claim, say) gets an
event naming why and is left to kube-scheduler (mode B): the gate is lifted. A claim that fits
nowhere now gets an event naming each node's reason (the same reason again only after
``EVENT_REPEAT_S``) and the pod stays gated; it is tried again as soon as a node's ledger or host
changes, as kube-scheduler requeues a pod on a cluster event, with a back-off as kube-scheduler's
(``CHANGE_RETRY_S`` after the first try, doubling up to ``retry_s``), and every ``retry_s`` in any
case. Pods are handled one at a time per uid, several at once, those of higher priority first
(``claim_turns``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from random import Random
from typing import Any, Protocol

from gpuledger_core import claims
from gpuledger_core.claim_asks import ClaimAsk, claim_ask
from gpuledger_core.claim_placement import Preferred, claim_as_pod, place_claim
from gpuledger_core.claim_status import allocation_status
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import Conflict, Exhausted, FailedPrecondition, GpuledgerError, InvalidArgument, NotFound
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, forget, release, reserve
from gpuledger_core.mig_place import MigChooser
from gpuledger_core.model import Allocation
from gpuledger_core.packing import NodeState, Policy
from gpuledger_core.pods import PodAsk
from gpuledger_core.preemption import room_held
from gpuledger_core.slots import slot_problem
from gpuledger_placement.claim_classes import ModeCClasses
from gpuledger_placement.claim_fields import pod_owner
from gpuledger_placement.claim_mig import make_instances
from gpuledger_placement.claim_pods import POD_CLAIM, claim_names, configs_of, describe, gate_removal, gated, share_ids
from gpuledger_placement.claim_turns import Turns, first_in_line
from gpuledger_placement.claim_write import write_allocation
from gpuledger_placement.claims import ALLOCATED_BY_LEDGER, WRITING_S, ClaimApi, ClaimsController, claim_path
from gpuledger_placement.convert import pod_ask_from
from gpuledger_placement.host_fit import host_refusal
from gpuledger_placement.hosts import HostUsage
from gpuledger_placement.metrics import CLAIMS_ALLOCATED
from gpuledger_placement.pod_events import pod_event
from gpuledger_placement.preemption_holders import priority_of
from gpuledger_placement.preemption_note import preemption_of, victim_left
from gpuledger_placement.unscheduled import follow_unscheduled
from gpuledger_placement.view import FleetView

log = logging.getLogger(__name__)
FINALIZER = ALLOCATED_BY_LEDGER
JSON_PATCH = "application/json-patch+json"
RETRY_S = 5.0
CONCURRENCY = 64  # pods settled at once: each holds its slot through four API calls and a ledger write
CHANGE_RETRY_S = 0.5  # the first back-off of a waiting pod, doubled on each try up to retry_s
EVENT_REPEAT_S = 60.0  # the same event on the same pod, at most this often
SEEN_S = 2.0  # how long a pod's gate waits for the watch of claims to bring its claims allocated
CHOICE_ROUNDS = 8  # nodes tried for a claim before it waits for retry_s


class AllocatorApi(ClaimApi, Protocol):
    """The claims controller's calls, and a pod's gate patched and an event created."""

    async def patch_object(self, path: str, body: Any, content_type: str) -> dict[str, Any]: ...
    async def create_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class _Early:
    task: asyncio.Task[None]
    ask: ClaimAsk


@dataclass(slots=True)
class ClaimAllocator:
    api: AllocatorApi
    claims: ClaimsController
    view: FleetView
    policy: Callable[[], Policy]
    hosts: HostUsage | None = None  # the cluster's Nodes (CPU, memory); None: not followed
    clock: Callable[[], float] = time.time
    retry_s: float = RETRY_S
    concurrency: int = CONCURRENCY
    _latest: dict[str, Mapping[str, Any] | None] = field(default_factory=dict)  # pod uid -> newest (None: gone)
    _busy: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _classes: ModeCClasses = field(init=False)  # the DeviceClasses mode C allocates for
    _slots: asyncio.Semaphore = field(init=False)
    _turns: Turns = field(default_factory=Turns)  # tries of pods of higher priority first
    _changes: int = 0  # the view's changes so far: a waiting pod is tried again after one
    _waiting: dict[str, asyncio.Event] = field(default_factory=dict)  # pod uid -> set to end its wait
    _on_change: set[str] = field(default_factory=set)  # waiting pods past their back-off: a change ends the wait
    _early: dict[str, _Early] = field(default_factory=dict)  # claim uid -> its allocation begun on its creation
    _pods: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # pod uid -> its newest gated version
    _generated: dict[str, dict[str, str]] = field(default_factory=dict)  # pod uid -> its template claims seen made
    _finalizers: set[asyncio.Task[None]] = field(default_factory=set)  # finalizers being written
    _told: dict[str, tuple[str, float]] = field(default_factory=dict)  # pod uid -> its last event's reason, when
    preempt: Callable[[Mapping[str, Any], ClaimAsk, list[str]], None] | None = None  # ``Preemptor.consider_claim``
    chooser: Callable[[], MigChooser] = MigChooser  # ``Policies.mig_chooser``: the MIG asks seen weigh placements
    observe: Callable[[PodAsk], None] = lambda _: None  # ``Policies.observe``: a claim counts in the workload
    refused: Callable[[Mapping[str, Any]], None] = lambda _: None  # ``ModeBPreemption.offer``: pods not gated
    preferred: Preferred | None = None  # ``PlacementService.best_nodes``: the classic pods' ranking
    rng: Random | None = None  # ``PlacementService.rng``: a randomized policy draws its node from it

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(self.concurrency)
        self._classes = ModeCClasses(self.api, self.claims.driver, self.clock)
        self.view.watch(self._changed)
        self.claims.cache.on_added = self._claim_added

    def _changed(self, node: str) -> None:
        self._changes += 1
        for uid in self._on_change.union(first_in_line(self._waiting, self._pods)):
            self._waiting[uid].set()

    async def run(self) -> None:
        """Follow (below) until cancelled; then the work it started ends with it (a claim or pod
        still being settled, a later look at a claim), rather than going on against a ledger or an
        API server that its service has closed."""
        try:
            await self._follow()
        finally:
            for task in tuple(self._busy.values()):
                task.cancel()

    async def _follow(self) -> None:
        """Follow the unscheduled pods and allocate the claims of the gated ones."""
        await self.view.ready.wait()
        await follow_unscheduled(self.api, self.offer, self.retry_s, "allocation")

    def offer(self, pod: Mapping[str, Any], gone: bool = False) -> None:
        """Take the pod's newest version; a gated pod is settled (one at a time per uid)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not gone and not gated(pod):
            self.refused(pod)  # kube-scheduler's to allocate: preempted for where it refused it
            return
        if not uid or (gone and uid not in self._busy):
            return
        if gone:
            self._pods.pop(uid, None)
        else:
            self._pods[uid] = pod
        self._wake(uid, None if gone else pod)
        if uid not in self._busy:
            self._busy[uid] = asyncio.create_task(self._drain(uid))

    def _wake(self, uid: str, pod: Mapping[str, Any] | None) -> None:
        """The pod settled again with this version (None: it is gone), at once if it waits."""
        self._latest[uid] = pod
        if (woken := self._waiting.get(uid)) is not None:
            woken.set()

    async def idle(self) -> None:
        while self._busy:
            await asyncio.gather(*list(self._busy.values()), return_exceptions=True)

    async def _drain(self, uid: str) -> None:
        backoff = CHANGE_RETRY_S
        try:
            while uid in self._latest:
                pod = self._latest.pop(uid)
                if pod is None:
                    return
                await self._turns.wait(uid, priority_of(pod))
                async with self._slots:  # a pod that waits (below) holds no slot
                    try:
                        done = await self.settle(pod)
                    except GpuledgerError as err:
                        log.warning("allocation: pod %s not settled (%s); tried again", describe(pod), err)
                        done = False
                self._turns.end(uid)
                if done and self._latest.get(uid) is pod:
                    del self._latest[uid]  # woken again by a claim made meanwhile: nothing left to do
                if not done:
                    await self._wait(uid, backoff)
                    backoff = min(backoff * 2, self.retry_s)
                    if uid not in self._latest:
                        self._turns.begin(uid, priority_of(pod))  # woken: ahead of lower tries from now
                        self._latest[uid] = await self._fresh(pod)
        finally:
            self._turns.end(uid)
            del self._busy[uid]
            self._pods.pop(uid, None)
            self._generated.pop(uid, None)
            self._told.pop(uid, None)

    async def _wait(self, uid: str, backoff: float) -> None:
        """Until the pod's next version (its generated claim named), a change of a node's ledger or
        host once ``backoff`` has passed, or ``retry_s``: woken by ``offer`` and ``_changed``, not
        by polling (a burst leaves a hundred pods waiting at once)."""
        loop = asyncio.get_running_loop()
        woken = self._waiting[uid] = asyncio.Event()
        seen, until = self._changes, loop.time() + self.retry_s
        try:
            if uid in self._latest:
                return  # a newer version came while the last one was settled
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), backoff)
            if uid in self._latest or self._changes != seen:
                return
            self._on_change.add(uid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), max(0.0, until - loop.time()))
        finally:
            self._on_change.discard(uid)
            del self._waiting[uid]

    async def _fresh(self, pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
        meta = pod.get("metadata") or {}
        try:
            found = await self.api.get_object(f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}")
        except NotFound:
            return None
        return found if (found.get("metadata") or {}).get("uid") == meta.get("uid") and gated(found) else None

    async def settle(self, pod: Mapping[str, Any]) -> bool:
        """Allocate the pod's claims and lift its gate; False to try again later (a claim not
        created yet, or one that fits nowhere now)."""
        names = claim_names(pod, self._generated.get(str(pod["metadata"]["uid"])))
        if names is None:
            await self._classes.get()  # known when the claim comes, to allocate it at once
            return False  # a template's claim is not created yet: its pod will change
        namespace = str(pod["metadata"]["namespace"])
        left = await victim_left(pod, self._get_pod)
        if left:
            log.debug("allocation: pod %s waits for pod %s, preempted for it, to end", describe(pod), left)
            return False
        classes = await self._classes.get()
        written: list[Mapping[str, Any]] = []
        for name in names:
            path = claim_path(ClaimRef(namespace, name, ""))
            raw = self.claims.cache.seen(namespace, name) or await self.api.get_object(path)  # the watch's, else read
            early = self._early.pop(claims.ref_of(raw).uid, None)
            if early is None and (raw.get("status") or {}).get("allocation"):
                ours = claims.results_of(raw, self.claims.driver)
                if ours and claims.ref_of(raw).owner.key not in self.view.holders:
                    return False  # not in the ledger (yet, or any more: preempted, it is deallocated first)
                continue  # allocated already (a shared claim, or an earlier round)
            if early is None:
                try:
                    ask = claim_ask(raw, classes, self.claims.driver, self.claims.memory_step_mib)
                except InvalidArgument as err:
                    await self._event(pod, "GpuledgerLeftToScheduler", f"{err}; kube-scheduler allocates it")
                    continue
                if ask is None:
                    continue
            else:
                ask = early.ask
            try:
                await (early.task if early is not None else self._allocate(pod, raw, ask, classes))
                written.append(raw)
            except Exhausted as err:
                await self._event(pod, "GpuledgerUnschedulable", f"the ledger cannot allocate the claim now: {err}")
                if self.preempt is not None:
                    host = self._host(pod)
                    self.preempt(pod, ask, [n for n in sorted(self.view.entries) if not host(NodeName(n))])
                return False
        self._turns.end(str(pod["metadata"]["uid"]))  # its room taken: the next tries may go on
        for claim in written:  # kube-scheduler's watch of claims runs beside the claims controller's
            meta = claim["metadata"]
            if not await self.claims.cache.seen_allocated(meta["namespace"], meta["name"], meta["uid"], SEEN_S):
                log.info("allocation: claim %s/%s not seen allocated within %gs; the gate is lifted anyway",
                         meta["namespace"], meta["name"], SEEN_S)  # fmt: skip
        await self._lift(pod)
        return True

    async def _allocate(self, pod: Mapping[str, Any], raw: Mapping[str, Any], ask: ClaimAsk, classes: Any) -> None:
        """The node chosen on the view (every node's fresh enough for that); the cards chosen again
        inside the compare-and-set on the node's ledger as it is, so that claims placed at once on
        one node do not refuse each other's cards (as the extender's bind plans a pod again)."""
        ref, now, policy, host, chooser = ask.ref, self.clock(), self.policy(), self._host(pod), self.chooser()
        asked = pod_ask_from(pod)  # the pod's CPU and memory: the policies weigh them as for a classic pod
        self.observe(claim_as_pod(ask, asked.cpu_milli, asked.memory_mib))  # as the extender counts a pod
        configs = configs_of(raw, classes, self.claims.driver)
        planned: dict[str, Any] = {}

        def transition(ledger: NodeLedger | None) -> NodeLedger:
            if ledger is None:
                raise NotFound(f"node {node} is not in the ledger")
            hold = ledger.of_owner(ref.owner.key)
            if room_held(hold) and hold is not None:  # the room preemption held for it: now its own
                ledger = release(ledger, hold.id, now, "taken by the claim it was held for")
            plan = place_claim(
                [ledger], ask, policy, AllocationId("c-planned"), now,
                slots_per_card=self.view.slots_per_card, mix_isolation=self.view.mix_isolation, chooser=chooser,
            )  # fmt: skip
            status = allocation_status(
                plan.allocation, ledger.node, self.claims.driver, now, shareable=self.view.slots_per_card > 1,
                chosen=plan.chosen, configs=configs, share_id=share_ids(ref),
            )  # fmt: skip
            written_claim = {"metadata": raw["metadata"], "status": {"allocation": status}}
            devices = claims.results_of(written_claim, self.claims.driver)
            allocation = claims.ledger_allocation(
                ref, devices, ledger.node, now, self.claims.memory_step_mib, ask.isolation
            )
            planned.update(status=status, allocation=allocation)
            held = ledger.of_owner(ref.owner.key)
            if held is not None and held.id == allocation.id and held.created_at == allocation.created_at:
                return ledger  # this very write, done already (an answer lost on the way back)
            if held is not None and now - held.created_at < WRITING_S:
                raise Conflict(f"{ref.describe()} holds ledger entry {held.id}: another placement replica allocates it")
            if held is not None:  # left by a replica that died before it wrote the claim
                ledger = release(ledger, held.id, now, "the claim is allocated again")
            problem = slot_problem(ledger, allocation, self.view.slots_per_card)
            if problem:
                raise Exhausted(problem)
            return reserve(forget(ledger, allocation.id), allocation, mix_isolation=self.view.mix_isolation)

        self.claims.allocating.add(ref.uid)
        try:
            for _ in range(CHOICE_ROUNDS):  # claims placed at once fill a node the view still shows free
                ledgers = self._held_room(ref, now) or self.view.fresh_ledgers()
                chosen = place_claim(
                    ledgers, ask, policy, AllocationId("c-planned"), now,
                    slots_per_card=self.view.slots_per_card, host=host, mix_isolation=self.view.mix_isolation,
                    state=self._state, cpu_milli=asked.cpu_milli, memory_mib=asked.memory_mib, chooser=chooser,
                    preferred=self.preferred, rng=self.rng,
                )  # fmt: skip
                node = chosen.allocation.node
                try:
                    written = await self.claims.store.mutate(node, transition)
                except Exhausted:
                    fresh, revision = await self.claims.store.read(node)  # the view learns what took it
                    self.view.apply(node, fresh, revision)
                    continue
                if written.new is not None:
                    self.view.apply(node, written.new, written.revision)
                    self.claims.written_here[ref.uid] = planned["allocation"].id
                break
            else:
                raise Exhausted(f"{ref.describe()}: the nodes chosen for it kept filling up before it was written")
            await self._made(pod, ref, planned["allocation"])
            task = await write_allocation(
                self.api, self.claims, ref, raw, planned["status"], pod, planned["allocation"]
            )
            self._finalizers.add(task)
            task.add_done_callback(self._finalizers.discard)
        finally:
            self.claims.allocating.discard(ref.uid)
        allocation = planned["allocation"]
        CLAIMS_ALLOCATED.inc()
        log.info(
            "allocation: %s allocated on %s (cards %s) for pod %s",
            ref.describe(), allocation.node, ",".join(str(s.index) for s in allocation.shares()), describe(pod),
        )  # fmt: skip

    async def _made(self, pod: Mapping[str, Any], ref: ClaimRef, allocation: Allocation) -> None:
        """The allocation's MIG instances made on its node (``claim_mig``); where one cannot be, its
        entry is released, the pod told, and the claim tried again later (``FailedPrecondition``)."""
        make = self.claims.make  # the claims controller's: it makes those of mode B's claims
        if make is None or all(s.mig is None for s in allocation.shares()):
            return
        why = await make_instances(make, allocation)
        if why:
            await self.claims.withdraw(ref, allocation, why)
            await self._event(pod, "GpuledgerMigNotMade", f"{ref.describe()}: {why}; tried again later")
            raise FailedPrecondition(why)

    def _claim_added(self, raw: Mapping[str, Any]) -> None:
        """A claim just created for a gated pod this allocator waits on: kube-controller-manager
        makes it from the pod's template, then names it in the pod's status. It is allocated now,
        while kube-controller-manager writes the pod, rather than after (not for a pod that waits
        for victims of preemption to end, ``victim_left``, nor before the device classes are
        known), and the pod is settled again at once: its claims are known by the marks
        kube-controller-manager gives the claims it makes (``POD_CLAIM``), so its gate is lifted
        as soon as they are allocated, whether or not its status names them yet (``settle``
        takes this allocation's outcome; kube-scheduler waits for the naming in any case)."""
        meta = raw.get("metadata") or {}
        owner = pod_owner(raw)
        pod = self._pods.get(owner)
        if pod is None or meta.get("deletionTimestamp"):
            return
        entry = (meta.get("annotations") or {}).get(POD_CLAIM)
        if entry:
            self._generated.setdefault(owner, {})[str(entry)] = str(meta.get("name"))
        self._allocate_early(pod, raw)
        if owner in self._busy:  # its drain runs (it was offered): settled again now
            self._wake(owner, pod)

    def _allocate_early(self, pod: Mapping[str, Any], raw: Mapping[str, Any]) -> None:
        if (raw.get("status") or {}).get("allocation"):
            return
        classes = self._classes.fresh()
        if classes is None or preemption_of(pod) is not None:
            return
        try:
            ask = claim_ask(raw, classes, self.claims.driver, self.claims.memory_step_mib)
        except InvalidArgument:
            return  # said by settle, which leaves it to kube-scheduler
        if ask is None:
            return
        uid = claims.ref_of(raw).uid
        if uid in self.claims.allocating or uid in self._early:
            return  # its pod's status named it first: settle allocates it
        task = asyncio.create_task(self._allocate_in_turn(pod, raw, ask, classes))
        self._early[uid] = _Early(task, ask)
        task.add_done_callback(lambda t: asyncio.get_running_loop().call_later(WRITING_S, self._forget, uid, t))

    async def _allocate_in_turn(
        self, pod: Mapping[str, Any], raw: Mapping[str, Any], ask: ClaimAsk, classes: Any
    ) -> None:
        await self._turns.wait(ask.ref.uid, priority_of(pod))
        try:
            await self._allocate(pod, raw, ask, classes)
        finally:
            self._turns.end(ask.ref.uid)

    def _forget(self, uid: str, task: asyncio.Task[None]) -> None:
        """An early allocation no settle took (its pod went): its outcome dropped; the claims
        controller settles what it left (the claim deleted with its pod, its entry released)."""
        if (early := self._early.get(uid)) is not None and early.task is task:
            del self._early[uid]
        if not task.cancelled():
            task.exception()

    def _held_room(self, ref: ClaimRef, now: float) -> list[NodeLedger]:
        """Where preemption holds the claim's room: that node's ledger as it will be once the claim
        takes it (the hold released); empty without a hold."""
        node = self.view.holders.get(ref.owner.key)
        entry = self.view.entries.get(node) if node else None
        hold = entry.ledger.of_owner(ref.owner.key) if entry is not None else None
        if entry is None or hold is None or not room_held(hold):
            return []
        return [release(entry.ledger, hold.id, now, "taken by the claim it was held for")]

    async def _get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        return await self.api.get_object(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def _state(self, ledger: NodeLedger) -> NodeState:
        """The node's state with its host, the view's own where it holds this very ledger."""
        entry = self.view.entries.get(ledger.node.name)
        if entry is not None and entry.ledger is ledger:
            return entry.state
        return self.view.state_of(ledger.node.name, ledger)

    def _host(self, pod: Mapping[str, Any]) -> Callable[[NodeName], str]:
        """Why the pod's host side refuses a node (untracked nodes: kube-scheduler checks them, and
        deallocates if it does not fit)."""
        return host_refusal(pod, self.hosts, self.view)

    async def _lift(self, pod: Mapping[str, Any]) -> None:
        patch, meta = gate_removal(pod), pod["metadata"]
        if patch is None:
            return
        try:
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            await self.api.patch_object(path, patch, JSON_PATCH)
        except InvalidArgument as err:  # the gates moved meanwhile: the pod's next version is settled
            raise Conflict(f"the scheduling gates of pod {describe(pod)} changed: {err}") from err

    async def _event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        meta = pod["metadata"]
        said, at = self._told.get(meta["uid"], ("", float("-inf")))
        if said == reason and self.clock() - at < EVENT_REPEAT_S:
            log.debug("allocation: pod %s: %s again: %s", describe(pod), reason, message)
            return  # tried again on a ledger change: the pod's events say it once a minute
        self._told[meta["uid"]] = (reason, self.clock())
        path, body = pod_event(pod, reason, message, "Warning", self.clock())
        try:
            await self.api.create_object(path, body)
        except GpuledgerError as err:
            log.warning("allocation: cannot record the event %s for pod %s: %s", reason, describe(pod), err)
        log.info("allocation: pod %s: %s: %s", describe(pod), reason, message)
