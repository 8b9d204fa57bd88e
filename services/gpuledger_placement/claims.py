"""The claims controller: the ledger decides every DRA allocation of our driver (docs/dra.md).

kube-scheduler allocates a ResourceClaim from the slices the inventory publishes; where the devices
carry the binding condition ``gpuledger.io/committed`` it then waits at PreBind (polling every
5 s) before it binds the pod. This controller lists and watches every ResourceClaim and, for one
allocated with devices of our driver:

1. reserves exactly that allocation in the node's ledger, with one compare-and-set (the claim's
   cards, what each result consumed; an allocation id derived from the claim's uid and devices, so a
   second replica or a retry writes nothing twice). Classic pods, tools and claims are counted
   against the same cards: a card a classic pod fills is refused to a claim, and the other way
   round (the extender and the allocator read the same ledger).
2. writes the claim's ``status.devices``: ``gpuledger.io/committed`` True, or
   ``gpuledger.io/rejected`` True with the ledger's reason, after which kube-scheduler takes the
   allocation back and tries again. A claim whose devices carry no binding condition (a pool
   published without them) is only mirrored: the ledger holds it, and a refusal is logged and
   counted, for the scheduler did not wait.
3. releases the claim's ledger entry when its allocation is cleared or the claim is deleted, and
   after every (re)listing releases the entries of claims that no longer hold one (older than a
   grace period, so an entry another replica wrote for a claim allocated after the listing stays;
   ``claims_sweep``).
4. for a claim mode C allocated (gpuledger's finalizer): once it is deleted and reserved for no
   pod, releases its entry and removes the finalizer; once its last consumer went (reserved for no
   pod, and no pod waiting to be scheduled names it), deallocates it as kube-controller-manager
   does the claims kube-scheduler allocated (status cleared, finalizer removed) and releases its
   entry (``claims_mend``).

Claims are handled one at a time per uid (the latest version wins), several uids at once.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from gpuledger_common.store import LedgerStore
from gpuledger_core import claims
from gpuledger_core.claims import AllocatedDevice, ClaimRef
from gpuledger_core.errors import Conflict, Exhausted, FailedPrecondition, GpuledgerError, InvalidArgument, NotFound
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger, forget, release, reserve
from gpuledger_core.model import Allocation, Isolation
from gpuledger_core.preemption import preempted, room_held
from gpuledger_core.slots import slot_problem
from gpuledger_placement import claim_fields as fields
from gpuledger_placement import claim_veto, claims_mend, claims_sweep
from gpuledger_placement.claim_cache import ClaimCache
from gpuledger_placement.claim_fields import ALLOCATED_BY_LEDGER as ALLOCATED_BY_LEDGER  # "X as X": re-exported
from gpuledger_placement.claim_fields import COMMITTED, LIST, REJECTED
from gpuledger_placement.claim_fields import RESOURCE as RESOURCE
from gpuledger_placement.claim_fields import claim_path as claim_path
from gpuledger_placement.claim_mig import Make, make_instances
from gpuledger_placement.claims_mend import UNUSED_AFTER_S
from gpuledger_placement.claims_mend import WRITING_S as WRITING_S
from gpuledger_placement.convert import epoch_of
from gpuledger_placement.metrics import CLAIM_COMMIT_SECONDS, CLAIMS
from gpuledger_placement.view import FleetView

log = logging.getLogger(__name__)
DRIVER = "gpu.gpuledger.io"
RETRY_S = 1.0
CONFLICT_ROUNDS = 5
ABSENT_RETRY_S = 60.0  # dra_claims=auto without DRA: how often to look again
RESYNC_S = 60.0  # how often the claims are listed again for entries no claim holds (the watch never lists)


class ClaimApi(Protocol):
    async def list_objects(self, path: str, params: Mapping[str, str], timeout_s: float = 60.0) -> dict[str, Any]: ...
    def watch(
        self, path: str, params: Mapping[str, str], timeout_s: float = 300.0
    ) -> AsyncIterator[dict[str, Any]]: ...
    async def get_object(self, path: str) -> dict[str, Any]: ...
    async def replace_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(slots=True)
class ClaimsController:
    api: ClaimApi
    store: LedgerStore
    view: FleetView
    driver: str = DRIVER
    memory_step_mib: int = claims.MEMORY_STEP_MIB
    clock: Callable[[], float] = time.time
    concurrency: int = 16
    resync_s: float = RESYNC_S
    _latest: dict[str, Mapping[str, Any] | None] = field(default_factory=dict)  # uid -> newest (None: deleted)
    _refs: dict[str, ClaimRef] = field(default_factory=dict)
    _deleted_on: dict[str, str] = field(default_factory=dict)  # uid -> the node a deleted claim's allocation named
    _busy: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _rechecks: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # uid -> a later look at an unused claim
    cache: ClaimCache = field(default_factory=ClaimCache)  # what the list and watch brought
    _slots: asyncio.Semaphore = field(init=False)
    # claim uids whose ledger entry mode C reserved and whose allocation it is writing: a version of
    # the claim from before that write must not release the entry (claim_allocator.py)
    allocating: set[str] = field(default_factory=set)
    written_here: dict[str, str] = field(default_factory=dict)  # claim uid -> the entry mode C just wrote for it
    finalizing: set[str] = field(default_factory=set)  # claim uids whose finalizer mode C is writing now
    make: Make | None = None  # mode B: a claim's MIG instances made before it is committed (``claim_mig``)

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(self.concurrency)

    async def run(self, optional: bool = False) -> None:
        """Follow (below) until cancelled; then the work it started ends with it (a claim or pod
        still being settled, a later look at a claim), rather than going on against a ledger or an
        API server that its service has closed."""
        sweeping = asyncio.create_task(claims_sweep.sweep(self))
        try:
            await self._follow(optional)
        finally:
            for task in (sweeping, *self._busy.values(), *self._rechecks.values()):
                task.cancel()

    async def _follow(self, optional: bool = False) -> None:
        """List, settle every claim, release what no claim holds, watch; again after any failure.
        ``optional``: where the API server has no ResourceClaims or this service account may not
        list them (DRA not deployed), say so once and look again every ``ABSENT_RETRY_S``."""
        await self.view.ready.wait()
        absent_said = False
        while True:
            try:
                started = self.clock()
                listed = await self.api.list_objects(LIST, {})
                items = listed["items"]
                self.cache.listed(items)
                for item in items:
                    self.offer(item)
                await self.idle()
                await claims_sweep.release_orphans(self, items, started)
                log.info("claims: %d ResourceClaim(s) listed and settled", len(items))
                absent_said = False
                await self._watch(str((listed.get("metadata") or {}).get("resourceVersion") or ""))
            except (NotFound, FailedPrecondition) as err:  # 404: no resource.k8s.io/v1; 403: no RBAC for it
                if not optional:
                    log.warning("claims: cannot follow ResourceClaims (%s); trying again in %gs", err, RETRY_S)
                else:
                    if not absent_said:
                        log.info("claims: not following ResourceClaims (%s); looking again later", err)
                    absent_said = True
                    await asyncio.sleep(ABSENT_RETRY_S)
                    continue
            except GpuledgerError as err:
                log.warning("claims: following ResourceClaims failed (%s); listing again in %gs", err, RETRY_S)
            await asyncio.sleep(RETRY_S)

    async def _watch(self, version: str) -> None:
        while True:
            async for event in self.api.watch(LIST, {"resourceVersion": version}):
                obj = event.get("object") or {}
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                kind = str(event.get("type"))
                self.cache.watched(kind, obj)
                if kind == "DELETED":
                    self.offer(obj, deleted=True)
                elif kind in ("ADDED", "MODIFIED"):
                    self.offer(obj)

    def offer(self, raw: Mapping[str, Any], deleted: bool = False) -> None:
        """Take the claim's newest version (``deleted``: it is gone) to settle."""
        ref = claims.ref_of(raw)
        if not ref.uid:
            return
        self._latest[ref.uid] = None if deleted else raw
        self._refs[ref.uid] = ref
        if deleted and (node := self._allocated_on(raw)):
            self._deleted_on[ref.uid] = node
        if ref.uid not in self._busy:
            self._busy[ref.uid] = asyncio.create_task(self._drain(ref.uid))

    async def idle(self) -> None:
        """Until every claim offered so far is settled."""
        while self._busy:
            await asyncio.gather(*list(self._busy.values()), return_exceptions=True)

    async def _drain(self, uid: str) -> None:
        try:
            async with self._slots:
                while uid in self._latest:
                    raw = self._latest.pop(uid)
                    ref = self._refs[uid]
                    try:
                        await (self._gone(ref) if raw is None else self.settle(raw))
                    except GpuledgerError as err:
                        log.warning("claims: %s not settled (%s); it is tried again", ref.describe(), err)
                        CLAIMS.labels("error").inc()
                        await asyncio.sleep(RETRY_S)
                        self._latest.setdefault(uid, await self._fresh(ref) if raw is not None else None)
        finally:
            del self._busy[uid]
            if uid not in self._latest:
                self._refs.pop(uid, None)
                self._deleted_on.pop(uid, None)

    async def _fresh(self, ref: ClaimRef) -> Mapping[str, Any] | None:
        try:
            found = await self.api.get_object(claim_path(ref))
        except NotFound:
            return None
        except GpuledgerError:
            return self._latest.get(ref.uid)
        return found if claims.ref_of(found).uid == ref.uid else None

    async def settle(self, raw: Mapping[str, Any]) -> None:
        """Make the ledger and the claim's device status agree with its allocation."""
        ref = claims.ref_of(raw)
        if await claims_mend.unfinalized(self, raw) or await claims_mend.unused(self, raw):
            return
        for _ in range(CONFLICT_ROUNDS):
            devices = claims.results_of(raw, self.driver)
            if not devices:
                if ref.uid in self.allocating or ref.owner.key not in self.view.holders:
                    return  # mode C is writing its allocation, or there is nothing to release
                entry = self._entry(ref)
                if room_held(entry):
                    return  # the room preemption holds for it until mode C allocates it (or it lapses)
                fresh = await self._fresh(ref)  # this version may predate mode C's write
                if fresh is not None and claims.results_of(fresh, self.driver) and ref.uid not in self.allocating:
                    raw = fresh
                    continue
                if ref.uid in self.allocating:
                    return
                if fresh is not None and entry is not None and await self._being_written(fresh, entry):
                    self._look_again(ref)
                    return
                await self._gone(ref)
                return
            decided = fields.decided(raw, self.driver, devices)
            if decided == REJECTED:
                return  # nothing was reserved; kube-scheduler takes the allocation back
            gated = any(COMMITTED in d.binding_conditions for d in devices)
            try:
                isolation = claims.isolation_of(raw, self.driver, devices)
                allocation = await self._reserve(ref, devices, isolation, _allocated_since(raw))
                if allocation is None:
                    log.info("claims: %s was preempted: it is deallocated once its pods are gone", ref.describe())
                    if gated:  # kube-scheduler's: no further pod may be bound onto the cards taken back
                        why = "its cards were taken back by preemption"
                        await self._decide(raw, devices, REJECTED, claim_veto.PREEMPTED, why)
                    return
            except (Exhausted, InvalidArgument, NotFound) as err:
                if gated and decided is None:
                    if await self._decide(raw, devices, REJECTED, "LedgerRefused", str(err)) is not None:
                        log.info("claims: %s rejected: %s", ref.describe(), err)
                        CLAIMS.labels("rejected").inc()
                        return
                    raw = await self._fresh(ref) or {}
                    continue
                if isinstance(err, NotFound) and not gated:
                    raise  # the node is not in the ledger yet: a mirrored claim is tried again
                log.error("claims: the ledger cannot hold %s, which the scheduler allocated: %s", ref.describe(), err)
                CLAIMS.labels("conflict").inc()
                return
            if not gated or decided == COMMITTED:
                CLAIMS.labels("mirrored" if not gated else "kept").inc()
                if not gated:
                    await claims_mend.mend(self, raw)
                return
            why = await self._unmade(ref, allocation)
            if why:  # rejected as the ledger rejects: kube-scheduler takes the allocation back and tries again
                if await self._decide(raw, devices, REJECTED, "MigNotMade", why) is not None:
                    CLAIMS.labels("rejected").inc()
                    return
                raw = await self._fresh(ref) or {}
                continue
            message = f"ledger allocation {allocation.id} on {allocation.node}"
            if await self._decide(raw, devices, COMMITTED, "Reserved", message) is not None:
                CLAIMS.labels("committed").inc()
                CLAIM_COMMIT_SECONDS.observe(max(0.0, self.clock() - fields.allocated_at(raw)))
                log.info("claims: %s committed as %s on %s", ref.describe(), allocation.id, allocation.node)
                return
            raw = await self._fresh(ref) or {}  # changed meanwhile: decide on its newest version
        raise Conflict(f"{ref.describe()} kept changing while its status was written")

    async def _unmade(self, ref: ClaimRef, allocation: Allocation) -> str:
        """Mode B: the MIG instances of a claim kube-scheduler allocated made on its node before it is
        committed (``claim_mig``); where one cannot be, its entry is released and why is returned."""
        if self.make is None or all(s.mig is None for s in allocation.shares()):
            return ""
        why = await make_instances(self.make, allocation)
        if why:
            log.info("claims: %s: %s", ref.describe(), why)
            await self._release_on(allocation.node, ref, why, only=allocation)
        return why

    async def release(self, ref: ClaimRef, reason: str, raw: Mapping[str, Any] | None = None) -> None:
        """Release the claim's ledger entry, wherever the view says it is; where the view does not
        know it (another replica's write this one has not seen yet), on the node the claim's own
        allocation (``raw``) names: the compare-and-set reads that node's ledger as it is."""
        node = self.view.holders.get(ref.owner.key) or (self._allocated_on(raw) if raw is not None else None)
        if node:
            await self._release_on(NodeName(node), ref, reason)

    def _allocated_on(self, raw: Mapping[str, Any]) -> str | None:
        """The node the claim's allocation of our devices names; None when it names none (or several)."""
        devices = claims.results_of(raw, self.driver)
        if not devices:
            return None
        try:
            return str(claims.node_of(claims.ref_of(raw), devices))
        except InvalidArgument:
            return None

    async def withdraw(self, ref: ClaimRef, allocation: Allocation, reason: str) -> None:
        """After mode C's write of an allocation failed: the claim as the API server holds it now
        decides. Allocated (by another placement replica, say), it is settled as any allocated
        claim, so that the ledger holds exactly that allocation; else only ``allocation`` is
        released (not an entry another replica wrote meanwhile). Where the claim cannot be read,
        the entry is released and the claim looked at again later, in case the write went through
        and only its answer was lost."""
        try:
            fresh = await self.api.get_object(claim_path(ref))
        except NotFound:
            fresh = {}
        except GpuledgerError as err:
            log.warning("claims: %s could not be read after its write failed (%s)", ref.describe(), err)
            fresh = None
            self._look_again(ref)
        if fresh and claims.ref_of(fresh).uid == ref.uid and claims.results_of(fresh, self.driver):
            self.offer(fresh)
            return
        await self._release_on(allocation.node, ref, reason, only=allocation)

    async def _being_written(self, raw: Mapping[str, Any], entry: Allocation) -> bool:
        """Whether the live entry of this unallocated claim may be mode C's, written by another
        placement replica that has not written the claim yet: younger than ``WRITING_S`` and the
        claim named (or owned: mode C allocates it as soon as it is made) by a pod waiting to be
        scheduled. It is looked at again later (and released then if the claim is still not
        allocated); releasing it now would let that replica write an allocation the ledger no
        longer holds."""
        return self.clock() - entry.created_at < WRITING_S and await claims_mend.awaited_by_a_pod(self, raw)

    def _look_again(self, ref: ClaimRef) -> None:
        """The claim read afresh and settled again after ``UNUSED_AFTER_S`` (once at a time per claim)."""
        if ref.uid in self._rechecks:
            return

        async def later() -> None:
            try:
                await asyncio.sleep(UNUSED_AFTER_S)
                fresh = await self._fresh(ref)
                if fresh is not None:
                    self.offer(fresh)
            finally:
                self._rechecks.pop(ref.uid, None)

        self._rechecks[ref.uid] = asyncio.create_task(later())

    def _entry(self, ref: ClaimRef) -> Allocation | None:
        """The claim's live ledger entry as the view shows it."""
        node = self.view.holders.get(ref.owner.key)
        entry = self.view.entries.get(node) if node else None
        return entry.ledger.of_owner(ref.owner.key) if entry is not None else None

    async def _reserve(
        self,
        ref: ClaimRef,
        devices: tuple[AllocatedDevice, ...],
        isolation: Isolation = Isolation.NONE,
        since: float = float("-inf"),
    ) -> Allocation | None:
        """Hold exactly this allocation in the node's ledger; None when preemption took it back
        (the claim keeps it in the API until its pods are gone, and is deallocated then). An entry
        preemption released before ``since`` (when the claim was allocated) was an earlier
        allocation of the same devices: kube-scheduler allocated the claim again, and it is held."""
        node = claims.node_of(ref, devices)
        owner = ref.owner
        elsewhere = self.view.holders.get(owner.key)
        if elsewhere and elsewhere != node:
            await self._release_on(NodeName(elsewhere), ref, "the claim was allocated on another node")
        now = self.clock()
        wanted = claims.allocation_id(ref, devices)
        held = self._entry(ref)
        if self.written_here.pop(ref.uid, None) == wanted and held is not None and held.id == wanted:
            return held  # mode C's own compare-and-set wrote it just now: no read to prove it again

        def transition(ledger: NodeLedger | None) -> NodeLedger:
            if ledger is None:
                raise NotFound(f"node {node} is not in the ledger")
            held = ledger.of_owner(owner.key)
            if held is not None and held.id == wanted:
                return ledger
            taken = ledger.get(wanted)
            if preempted(taken) and taken is not None and taken.updated_at >= since:
                return ledger
            if held is not None:
                ledger = release(ledger, held.id, now, "the claim was allocated again")
            allocation = claims.ledger_allocation(ref, devices, ledger.node, now, self.memory_step_mib, isolation)
            problem = slot_problem(ledger, allocation, self.view.slots_per_card)
            if problem:
                raise Exhausted(problem)
            return reserve(forget(ledger, wanted), allocation, mix_isolation=self.view.mix_isolation)

        written = await self.store.mutate(node, transition)
        found = written.new.get(wanted) if written.new is not None else None
        if preempted(found):
            return None
        if found is None or written.new is None:
            raise Conflict(f"the ledger entry of {ref.describe()} on {node} was not written")
        self.view.apply(node, written.new, written.revision)
        return found

    async def _decide(
        self, raw: Mapping[str, Any], devices: tuple[AllocatedDevice, ...], kind: str, reason: str, message: str
    ) -> dict[str, Any] | None:
        """Write the condition ``kind`` on each of our devices' status; None when the claim changed
        meanwhile (409) or is gone."""
        ref = claims.ref_of(raw)
        body = copy.deepcopy(dict(raw))
        status = body.setdefault("status", {})
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        condition = {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message[:1000],
            "lastTransitionTime": datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            **({"observedGeneration": generation} if generation else {}),
        }
        ours = {d.key for d in devices}
        kept = [s for s in status.get("devices") or [] if not fields.ours(s, self.driver, ours)]
        status["devices"] = kept + [fields.device_status(self.driver, d, condition) for d in devices]
        try:
            return await self.api.replace_object(f"{claim_path(ref)}/status", body)
        except (Conflict, NotFound):
            return None

    async def _gone(self, ref: ClaimRef) -> None:
        """The claim deleted, or its allocation cleared: its entry released, where the view says it
        is or, for a deleted claim the view does not know the entry of, where its allocation was."""
        self.written_here.pop(ref.uid, None)
        node = self.view.holders.get(ref.owner.key) or self._deleted_on.get(ref.uid)
        if node:
            await self._release_on(NodeName(node), ref, "the claim's allocation was cleared or the claim deleted")

    async def _release_on(self, node: NodeName, ref: ClaimRef, reason: str, only: Allocation | None = None) -> None:
        """Release the claim's entry on ``node`` (only if it is ``only``, the same write, when given)."""
        owner = ref.owner
        now = self.clock()

        def transition(ledger: NodeLedger | None) -> NodeLedger | None:
            held = ledger.of_owner(owner.key) if ledger is not None else None
            if ledger is None or held is None:
                return ledger
            if only is not None and (held.id, held.created_at) != (only.id, only.created_at):
                return ledger
            return release(ledger, held.id, now, reason)

        written = await self.store.mutate(node, transition)
        if written.new is not None:
            self.view.apply(node, written.new, written.revision)
        CLAIMS.labels("released").inc()
        log.info("claims: released the ledger entry of %s on %s (%s)", ref.describe(), node, reason)


def _allocated_since(raw: Mapping[str, Any]) -> float:
    """When the claim was allocated (its ``allocationTimestamp``, whole seconds); -inf where it
    names none, so that an entry preemption took back is never taken for an earlier allocation."""
    stamp = ((raw.get("status") or {}).get("allocation") or {}).get("allocationTimestamp")
    return epoch_of(stamp, float("-inf"))
