"""The plugin's work: device list, preferred allocation, Allocate, reconciliation.

Transport-free: the gRPC adapter (``server.py``) converts messages, bounds every call in time
and turns errors into kubelet-facing messages. Matching decisions are serialised by one lock,
since each depends on which containers were already answered (``served``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from gpuledger_core.errors import Conflict, FailedPrecondition, GpuledgerError, NotFound, Unavailable
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Node
from gpuledger_core.slots import card_of
from gpuledger_plugin import matching as m
from gpuledger_plugin.answer import Answer, AnswerPolicy, answer
from gpuledger_plugin.appliable import unappliable
from gpuledger_plugin.board import DeviceBoard, MigBoards
from gpuledger_plugin.cdi_specs import CdiSpecs
from gpuledger_plugin.devices import advertised
from gpuledger_plugin.kubelet_findings import GONE_AFTER_S, Comparison, Finding, compare, gone
from gpuledger_plugin.ledger_port import NodeLedgerPort
from gpuledger_plugin.metrics import IDENTITY, RECONCILE_MISMATCHES, RECONCILE_REPAIRS, UNBOUND_LOST
from gpuledger_plugin.mig_allocate import MigAllocate, MigMaker, Unmade
from gpuledger_plugin.mig_answer import MIG_MINORS_FILE
from gpuledger_plugin.mig_resources import GPU_RESOURCE, has_mig
from gpuledger_plugin.mig_resources import accepts as accepts_of
from gpuledger_plugin.podresources import PodResourcesPort
from gpuledger_plugin.preferred import Placement
from gpuledger_plugin.transitions import GrantRef, bind
from gpuledger_plugin.waits import ALLOCATE_WAIT_S, PREFERRED_WAIT_S, UNREACHABLE_WAIT_S, NotNow, patiently, pauses

log = logging.getLogger(__name__)
T = TypeVar("T")

UNBOUND_CONFLICTS = 10  # refusals of such a bind's write before it is given up as lost


@dataclass(frozen=True, slots=True)
class Outcome:
    """One answered Allocate: the container's answer and how it was identified."""

    answer: Answer
    allocation_id: AllocationId
    container: str
    how: str
    instances: tuple[Allocation, int] | None = None  # a MIG grant (its index): its instances still to make


class PluginService:
    def __init__(
        self,
        node: str,
        ledger: NodeLedgerPort,
        placement: Placement,
        pods: PodResourcesPort,
        policy: AnswerPolicy,
        slots_per_card: int,
        clock: Callable[[], float] = time.time,
        gone_after_s: float = GONE_AFTER_S,
        preferred_wait_s: float = PREFERRED_WAIT_S,
        allocate_wait_s: float = ALLOCATE_WAIT_S,
        unreachable_wait_s: float = UNREACHABLE_WAIT_S,
        maker: MigMaker | None = None,
        mig_minors_file: str = MIG_MINORS_FILE,
    ) -> None:
        self.node, self.ledger, self.placement, self.pods = node, ledger, placement, pods
        self.policy, self.slots_per_card, self.clock = policy, slots_per_card, clock
        self.gone_after_s = gone_after_s  # how long a bound allocation's pod must be missing from kubelet
        self.preferred_wait_s, self.allocate_wait_s = preferred_wait_s, allocate_wait_s
        self.unreachable_wait_s = unreachable_wait_s
        self.seen: NodeLedger | None = None  # the node's ledger as the watch last brought it
        self.unbound: dict[GrantRef, tuple[frozenset[str], tuple[str, ...]]] = {}  # admitted from the copy
        self._unbound_added = asyncio.Event()
        self.board = DeviceBoard()  # gpuledger.io/gpu's
        self.mig_boards = MigBoards(slots_per_card)
        self.has_mig = False  # a card of the node is in MIG mode: the gpu resource's calls skip MIG grants
        self.inventory: Node | None = None
        self.served: dict[AllocationId, set[int]] = {}
        self.steered: dict[frozenset[str], GrantRef] = {}
        self._absent: dict[AllocationId, float] = {}  # bound, its pod not listed by kubelet: since when
        self._lock = asyncio.Lock()
        self._calls = 0  # kubelet's calls taken so far (each may change what the plugin served or steered)
        self.cdi = CdiSpecs(policy.cdi_spec_dirs)
        self.mig = MigAllocate(maker or Unmade(), ledger, policy, self.cdi, mig_minors_file, clock)

    # --- the device list ---

    async def follow_ledger(self) -> None:
        """Keep the device list in step with the node's cards and their health. The watch is closed
        when this ends (cancelled while the device list is published, too: its tasks end with it)."""
        async with contextlib.aclosing(self.ledger.watch()) as ledgers:
            async for ledger in ledgers:
                await self._seen(ledger)

    async def _seen(self, ledger: NodeLedger | None) -> None:
        self.seen = ledger
        node = ledger.node if ledger is not None else None
        if node != self.inventory or not self.board.version:
            self.inventory = node
            self.has_mig = node is not None and any(c.mig for c in node.cards)
            await self.board.publish(advertised(node, self.slots_per_card))
            await self.mig_boards.publish(node)
            self.mig.mig_cdi.follow(node)  # the CDI specs of destroyed MIG instances go

    def accepts(self, resource: str) -> m.Accepts:
        """Which grants a call of ``resource`` may match (``mig_resources.accepts``); on a node
        without a card in MIG mode, every grant for the gpu resource, as before MIG."""
        if resource == GPU_RESOURCE and not self.has_mig:
            return None
        return accepts_of(resource)

    async def _read(self) -> NodeLedger:
        ledger = await self.ledger.read()
        if self.inventory is None:
            # Only until the watch speaks: a read that started before a change the watch has
            # already delivered would otherwise put the old device list back.
            await self._seen(ledger)
        if ledger is None:
            raise NotFound(f"the ledger has no entry for node {self.node} (is its inventory running?)")
        return ledger

    # --- GetPreferredAllocation ---

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int, accepts: m.Accepts = None
    ) -> list[str]:
        async with self._lock:
            self._calls += 1
            try:  # kubelet follows the hint: one made without the ledger takes others' devices
                ledger = await self._patiently("GetPreferredAllocation", self._read, self.preferred_wait_s)
            except GpuledgerError as err:
                # kubelet fails the pod on any error here: steer from the node's last known ledger
                # (placement wrote the reservation before the bind: the watch has usually brought it).
                if self.seen is None:
                    log.warning("preferred allocation without the ledger: %s", err)
                    return await self._by_topology(available, must_include, size)
                log.warning("preferred allocation from the node's last known ledger: %s", err)
                ledger = self.seen
            decision = m.steer(ledger, self.served, available, must_include, size, None, accepts)
            if isinstance(decision, m.Ambiguous):
                admitting = await self._admitting(ledger)
                decision = m.steer(ledger, self.served, available, must_include, size, admitting, accepts)
            if isinstance(decision, m.Ambiguous):
                IDENTITY.labels("refused").inc()
                raise FailedPrecondition(_ambiguity(decision))
            if isinstance(decision, m.Refused):
                log.info("no reservation to steer to (%s); ranking cards by topology", decision.reason)
                return await self._by_topology(available, must_include, size)
            slot = decision.slot
            self.steered[frozenset(decision.ids)] = (slot.allocation.id, slot.index)
            IDENTITY.labels("guessed" if decision.guessed else "steered").inc()
            return list(decision.ids)

    async def _by_topology(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        if self.inventory is None:
            return []
        return await self.placement.preferred(self.inventory, available, must_include, size)

    # --- Allocate ---

    async def allocate(self, device_ids: Sequence[str], accepts: m.Accepts = None) -> Outcome:
        """Bind the reservation these device IDs belong to, waiting for a ledger that cannot be
        reached or would not take the write (see ``waits``); then make its MIG instances, if it
        holds any (``mig_allocate``), outside that wait."""
        async with self._lock:
            self._calls += 1
            what = f"Allocate for {sorted(device_ids)}"
            try:
                work = lambda: self._allocate(device_ids, accepts)  # noqa: E731
                outcome = await self._patiently(what, work, self.allocate_wait_s)
            except NotNow as err:
                found = await self._from_copy(device_ids, accepts)
                if found is None:
                    raise Unavailable(
                        f"{err}, and the node's last known ledger holds no reservation for devices {sorted(device_ids)}"
                    ) from None
                return await self._with_instances(found, release=False)  # the ledger is away
            return await self._with_instances(outcome, release=True)

    async def _with_instances(self, outcome: Outcome, release: bool) -> Outcome:
        """The outcome of a MIG grant with its instances made and its answer; where that fails, the
        container is not answered (nor bound later, when admitted from the copy)."""
        if outcome.instances is None or self.inventory is None:
            return outcome
        allocation, index = outcome.instances
        try:
            made = await self.mig.answer(self.inventory, allocation, allocation.grants[index], release)
        except BaseException:
            self.unbound.pop((allocation.id, index), None)
            self.served.get(allocation.id, set()).discard(index)
            raise
        return replace(outcome, answer=made, instances=None)

    def _outcome(self, allocation: Allocation, index: int, how: str) -> Outcome:
        grant = allocation.grants[index]
        if has_mig(grant):
            return Outcome(Answer(), allocation.id, grant.container, how, (allocation, index))
        assert self.inventory is not None
        return Outcome(answer(self.inventory, allocation, grant, self.policy), allocation.id, grant.container, how)

    async def _patiently(self, what: str, work: Callable[[], Awaitable[T]], wait_s: float) -> T:
        return await patiently(what, work, wait_s, self.unreachable_wait_s, self.ledger.answered_at)

    async def _from_copy(self, device_ids: Sequence[str], accepts: m.Accepts) -> Outcome | None:
        """The container's answer from the node's last known ledger, when it holds a live
        reservation for these devices, or for other slots of the same cards (a restarted kubelet
        may have taken the reserved ones for the pod already); placement writes it before the bind.
        Its bind is written by ``bind_unbound_forever`` once the ledger answers again. None otherwise."""
        ledger, now = self.seen, self.clock()
        if ledger is None or self.inventory is None:
            return None
        decision = await self._resolved(ledger, device_ids, accepts)  # kubelet's PodResources needs no ledger
        if not isinstance(decision, m.Found) or decision.guessed:
            return None
        slot = decision.slot
        if decision.rehome and sorted(map(card_of, decision.ids)) != sorted(map(card_of, slot.ids)):
            return None  # other cards than reserved: only the ledger may move a grant across cards
        if not slot.allocation.held_at(now):
            return None
        grant = slot.allocation.grants[slot.index]
        found = self._outcome(slot.allocation, slot.index, "unbound")
        if found.instances is None:
            self._check_appliable(found.answer, slot)
        ref = (slot.allocation.id, slot.index)
        self.unbound[ref] = (frozenset(slot.ids), decision.ids)
        self._unbound_added.set()
        self.served.setdefault(slot.allocation.id, set()).add(slot.index)
        self.steered.pop(frozenset(device_ids), None)
        IDENTITY.labels("unbound").inc()
        log.warning(
            "admitted %s container %r from the node's last known ledger (the ledger does not answer): cards %s; "
            "its bind is written when the ledger is back",
            slot.allocation.owner.describe(),
            grant.container,
            ",".join(s.uuid for s in grant.cards),
            extra={"allocation": slot.allocation.id, "node": self.node},
        )
        return found

    async def bind_unbound_forever(self) -> None:
        """Write the binds of containers admitted from the node's last known ledger, as soon as the
        ledger takes them; a reservation that is gone by then is said loudly (its cards may have
        gone to another pod while this node could not reach the ledger)."""
        while True:
            await self._unbound_added.wait()
            self._unbound_added.clear()
            while self.unbound:
                ref = next(iter(self.unbound))
                await self._bind_unbound(ref, *self.unbound[ref])
                self.unbound.pop(ref, None)

    async def _bind_unbound(self, ref: GrantRef, expected: frozenset[str], ids: tuple[str, ...]) -> None:
        """Kept while the ledger is away (``Unavailable``); given up after a few refusals of the
        write (``Conflict``: lost races, or the reservation changed) or any other error."""
        conflicts = 0
        for pause in pauses():
            try:
                await self.ledger.mutate(functools.partial(bind, ref=ref, expected=expected, ids=ids, now=self.clock()))
                break
            except Unavailable:
                pass
            except Conflict as err:
                conflicts += 1
                if conflicts >= UNBOUND_CONFLICTS:
                    self._unbound_lost(ref, err)
                    return
            except GpuledgerError as err:
                self._unbound_lost(ref, err)
                return
            await asyncio.sleep(pause)
        log.info("bound %s container %d, admitted while the ledger was away", ref[0], ref[1])

    def _unbound_lost(self, ref: GrantRef, err: GpuledgerError) -> None:
        UNBOUND_LOST.inc()
        log.error("could not bind %s container %d, admitted while the ledger was away: %s", ref[0], ref[1], err)

    async def _allocate(self, device_ids: Sequence[str], accepts: m.Accepts) -> Outcome:
        ledger = await self._read()
        return await self._bind(await self._identify(ledger, device_ids, accepts))

    async def _identify(self, ledger: NodeLedger, device_ids: Sequence[str], accepts: m.Accepts) -> m.Found:
        decision = await self._resolved(ledger, device_ids, accepts)
        if isinstance(decision, m.Ambiguous):
            IDENTITY.labels("refused").inc()
            raise FailedPrecondition(_ambiguity(decision))
        if isinstance(decision, m.Refused):
            IDENTITY.labels("refused").inc()
            raise FailedPrecondition(decision.reason)
        return decision

    async def _resolved(self, ledger: NodeLedger, device_ids: Sequence[str], accepts: m.Accepts) -> m.Decision:
        """The container whose reservation these device IDs belong to (the hint kubelet took
        first), asking kubelet's PodResources which pod it admits where reservations look alike."""
        steered = _slot_of(ledger, self.steered.get(frozenset(device_ids)))
        decision = m.resolve(ledger, self.served, device_ids, None, steered, accepts)
        if isinstance(decision, m.Ambiguous):
            decision = m.resolve(ledger, self.served, device_ids, await self._admitting(ledger), steered, accepts)
        return decision

    async def _bind(self, found: m.Found) -> Outcome:
        slot, ref = found.slot, (found.slot.allocation.id, found.slot.index)
        now, inventory = self.clock(), self.inventory
        trade = None if found.trade is None else ((found.trade.allocation.id, found.trade.index), found.trade.ids)

        def bound(ledger: NodeLedger | None) -> NodeLedger:
            new = bind(ledger, ref, slot.ids, found.ids, now, trade)
            if self.policy.names_devices and inventory is not None:  # on the cards it binds (a rehome moves them)
                allocation = new.get(ref[0])
                assert allocation is not None
                if not has_mig(allocation.grants[ref[1]]):  # a MIG answer is checked once its instances are made
                    self._check_appliable(answer(inventory, allocation, allocation.grants[ref[1]], self.policy), slot)
            return new

        try:
            written = await self.ledger.mutate(bound)
        except NotFound as err:  # released since it was identified (a bind retried elsewhere, say)
            raise Conflict(f"{err} while it was being bound: the container is identified again") from err
        allocation = written.get(ref[0]) if written is not None else None
        if allocation is None or self.inventory is None:
            raise Conflict(f"allocation {ref[0]} vanished while answering")
        grant = allocation.grants[ref[1]]
        self.served.setdefault(allocation.id, set()).add(ref[1])
        self.steered.pop(frozenset(found.ids), None)
        how = "rehomed" if found.rehome else "guessed" if found.guessed else "exact"
        IDENTITY.labels(how).inc()
        if found.trade is not None:
            log.info(
                "kubelet chose %s, on the cards reserved for %s: it and %s traded reservations",
                ",".join(found.ids),
                found.trade.describe(),
                slot.describe(),
                extra={"allocation": allocation.id, "node": self.node},
            )
        log.info(
            "allocated %s to %s container %r (%s): cards %s",
            ",".join(found.ids),
            allocation.owner.describe(),
            grant.container,
            how,
            ",".join(s.uuid for s in grant.cards),
            extra={"allocation": allocation.id, "node": self.node},
        )
        return self._outcome(allocation, ref[1], how)

    def _check_appliable(self, planned: Answer, slot: m.Slot) -> None:
        """Refuse, before binding, an answer the runtime cannot apply (``appliable``)."""
        problem = unappliable(planned, self.policy, self.cdi)
        if problem:
            raise FailedPrecondition(f"{slot.allocation.owner.describe()}: {problem}")

    # --- which pod is kubelet admitting ---

    async def _admitting(self, ledger: NodeLedger) -> frozenset[m.PodKey] | None:
        """Pods kubelet runs or is admitting (PodResources List); None when it cannot say.

        Containers whose reserved IDs kubelet already gave them count as answered, so only the
        pod being admitted still has containers to admit.
        """
        try:
            view = await self.pods.list()
        except GpuledgerError as err:
            log.warning("cannot ask kubelet which pod it is admitting: %s", err)
            return None
        self._confirm(compare(ledger, view, self.clock()))
        return frozenset(view)

    def _confirm(self, comparison: Comparison) -> None:
        for allocation_id, index in comparison.confirmed:
            self.served.setdefault(allocation_id, set()).add(index)

    # --- reconciliation ---

    async def reconcile(self) -> tuple[Finding, ...]:
        """Compare the ledger with kubelet's record; repair what can be repaired. The ledger is read
        before the lock is taken, so that kubelet's calls never wait behind a read that waits for
        the ledger (they waited up to 12 s more when it did, in the real node's outage benchmark);
        it is read again under the lock only when a call of kubelet's came in between."""
        view = await self.pods.list()
        calls = self._calls
        ledger = await self._read()
        async with self._lock:
            if self._calls != calls:
                ledger = await self._read()
            now = self.clock()
            comparison = compare(ledger, view, now)
            self._confirm(comparison)
            self._forget(ledger)
            findings = list(comparison.findings)
            findings += [gone(a, now) for a in comparison.absent if a.id in self.served and self._gone(a.id, now)]
            self._absent = {a.id: self._absent.get(a.id, now) for a in comparison.absent}
            for finding in findings:
                await self._repair(finding)
        return tuple(findings)

    def _gone(self, allocation_id: AllocationId, now: float) -> bool:
        """Missing from kubelet's list in an earlier round too, and for ``gone_after_s``; only an
        allocation kubelet was seen to hold (``served``: answered here, or found in its list) is
        ever gone. A pod bound but not admitted yet is not in kubelet's list either, and after a
        kubelet restart a burst's last pods waited longer than ``gone_after_s`` for admission and
        lost their allocations (the e2e kubelet-restart test, now and then); a pod deleted before
        kubelet admitted it is the allocator's to release (its pod watch). Two
        rounds alone were not enough: a round right after a kubelet restart (the plugin registers
        again and reconciles at once), before the new kubelet had listed its pods, followed one
        that ran while a pod's devices were being recorded, and a pod still running lost its
        allocation (the e2e kubelet-restart test, now and then)."""
        since = self._absent.get(allocation_id)
        return since is not None and now - since >= self.gone_after_s

    async def _repair(self, finding: Finding) -> None:
        RECONCILE_MISMATCHES.labels(finding.kind).inc()
        pod = "/".join(finding.pod)
        log.warning(
            "ledger and kubelet disagree (%s) on pod %s container %r: ledger has %s; kubelet has %s",
            finding.kind,
            pod,
            finding.container,
            finding.ledger_side,
            finding.kubelet_side,
            extra={"pod": pod, "node": self.node},
        )
        if finding.repair is None:
            RECONCILE_REPAIRS.labels(finding.kind, "impossible").inc()
            return
        try:
            await self.ledger.mutate(finding.repair)
        except GpuledgerError as err:
            RECONCILE_REPAIRS.labels(finding.kind, "failed").inc()
            log.warning("could not repair %s on pod %s: %s", finding.kind, pod, err)
            return
        RECONCILE_REPAIRS.labels(finding.kind, "repaired").inc()
        self._answered_follow(finding)
        log.info("repaired %s on pod %s: the ledger now follows kubelet", finding.kind, pod)

    def _answered_follow(self, finding: Finding) -> None:
        """``served`` marks the grants holding the IDs kubelet was given, so it follows the IDs a
        repair moved: kubelet admitted the holder, and a swap's other grant takes the holder's
        mark of before (with its IDs). Left where they were, a swap of reservations kubelet took
        in another order than the plugin guessed left the pod kubelet had admitted pending, on IDs
        kubelet no longer offers, and the one it had not admitted answered: a later pod found no
        reservation to steer to and was refused (the DRA throughput benchmark's classic round)."""
        if finding.holder is None:
            return
        if finding.vacated is not None:
            self._mark(finding.vacated, finding.holder[1] in self.served.get(finding.holder[0], ()))
        self._mark(finding.holder, True)

    def _mark(self, ref: GrantRef, answered: bool) -> None:
        marks = self.served.setdefault(ref[0], set())
        if answered:
            marks.add(ref[1])
        else:
            marks.discard(ref[1])

    def _forget(self, ledger: NodeLedger) -> None:
        live = {a.id for a in ledger.live()}
        for allocation_id in [a for a in self.served if a not in live]:
            del self.served[allocation_id]
        self.steered = {k: v for k, v in self.steered.items() if v[0] in live}

    async def reconcile_forever(self, interval_s: float, wake: asyncio.Event | None = None) -> None:
        wake = wake or asyncio.Event()
        while True:
            try:
                await self.reconcile()
            except GpuledgerError as err:
                log.warning("reconciliation skipped: %s", err)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):  # not wait_for: it can swallow a cancel
                    await wake.wait()
            wake.clear()


def _slot_of(ledger: NodeLedger, ref: GrantRef | None) -> m.Slot | None:
    if ref is None:
        return None
    allocation = ledger.get(ref[0])
    if allocation is None or not allocation.live or ref[1] >= len(allocation.grants):
        return None
    return m.Slot(allocation, ref[1])


def _ambiguity(decision: m.Ambiguous) -> str:
    pods = ", ".join(sorted({c.describe() for c in decision.candidates}))
    return (
        f"cannot tell which of {pods} kubelet is admitting: they reserved the same number of "
        "devices with different cards or limits, and kubelet's PodResources API did not say. "
        "Refusing rather than risking a swap; check that the plugin can reach "
        "/var/lib/kubelet/pod-resources/kubelet.sock, then recreate the pod"
    )
