"""The ledger against what kubelet recorded (PodResources List): findings and repairs (pure).

kubelet's record is the truth about which container holds which device IDs; each container's
env was built from the grant those IDs belonged to. A finding is logged with both sides and
counted; where the ledger can be made to match kubelet, the finding carries the transition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuledger_core.errors import Conflict
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, commit, release
from gpuledger_core.model import Allocation, AllocState
from gpuledger_core.slots import holders_of_ids
from gpuledger_plugin.matching import PodKey, Slot, exact, pod_allocations
from gpuledger_plugin.transitions import GrantRef, rehome, swap

KubeletView = Mapping[PodKey, Mapping[str, frozenset[str]]]  # every active pod; our devices only
Repair = Callable[[NodeLedger | None], NodeLedger | None]


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # unbound | moved | swapped | unknown | conflict | gone
    pod: PodKey
    container: str
    ledger_side: str
    kubelet_side: str
    repair: Repair | None = None
    holder: GrantRef | None = None  # the grant that holds kubelet's IDs once repaired
    vacated: GrantRef | None = None  # a swap's other grant: it takes the holder's IDs of before


@dataclass(frozen=True, slots=True)
class Comparison:
    findings: tuple[Finding, ...]
    confirmed: tuple[GrantRef, ...]  # containers whose IDs agree: kubelet has admitted them
    absent: tuple[Allocation, ...]  # bound allocations whose pod kubelet no longer runs


def compare(ledger: NodeLedger, kubelet: KubeletView, now: float) -> Comparison:
    findings: list[Finding] = []
    confirmed: list[GrantRef] = []
    handled: set[GrantRef] = set()
    for pod, containers in sorted(kubelet.items()):
        for container, ids in sorted(containers.items()):
            if not ids:
                continue
            found = _check(ledger, pod, container, ids, now, handled)
            if isinstance(found, Finding):
                findings.append(found)
            else:
                confirmed.append(found)
    absent = tuple(
        a
        for a in pod_allocations(ledger)
        if a.state is AllocState.BOUND
        and any(g.device_ids for g in a.grants)
        and (a.owner.namespace, a.owner.name) not in kubelet
    )
    return Comparison(tuple(findings), tuple(confirmed), absent)


GONE_AFTER_S = 60.0  # how long a bound allocation's pod must be missing from kubelet's list (default)


def gone(allocation: Allocation, now: float) -> Finding:
    pod = (allocation.owner.namespace, allocation.owner.name)
    reason = "kubelet no longer runs the pod"
    return Finding(
        "gone",
        pod,
        "",
        f"{allocation.id} bound",
        "pod not among kubelet's active pods",
        lambda ledger: None if ledger is None else release(ledger, allocation.id, now, reason),
    )


def _check(
    ledger: NodeLedger,
    pod: PodKey,
    container: str,
    ids: frozenset[str],
    now: float,
    handled: set[GrantRef],
) -> Finding | GrantRef:
    shown = ",".join(sorted(ids))
    own = _own_slot(ledger, pod, container)
    if own is None:
        holder = exact(ledger, ids, {})
        side = f"held by {holder[0].describe()}" if holder else "no live reservation"
        return Finding("unknown", pod, container, side, shown)
    ref = (own.allocation.id, own.index)
    mine = ",".join(sorted(own.ids))
    if own.ids == ids:
        if own.allocation.state is AllocState.RESERVED:
            aid = own.allocation.id
            return Finding("unbound", pod, container, "reserved", f"{shown} admitted", _commit(aid, now), ref)
        return ref
    if ref in handled:
        return ref
    others = [s for s in exact(ledger, ids, {}) if s.allocation.id != own.allocation.id]
    if others:
        theirs = (others[0].allocation.id, others[0].index)
        handled.update((ref, theirs))
        side = f"{mine}; {shown} reserved for {others[0].describe()}"
        return Finding("swapped", pod, container, side, shown, _swap(ref, own, others[0]), ref, theirs)
    holders = holders_of_ids(ledger)
    if any(holders.get(i, own.allocation.id) != own.allocation.id for i in ids):
        return Finding("conflict", pod, container, mine, f"{shown} (partly reserved for another pod)")
    handled.add(ref)
    return Finding("moved", pod, container, mine, shown, _rehome(ref, own.ids, ids), ref)


def _own_slot(ledger: NodeLedger, pod: PodKey, container: str) -> Slot | None:
    for allocation in pod_allocations(ledger):
        if (allocation.owner.namespace, allocation.owner.name) != pod:
            continue
        named = [i for i, g in enumerate(allocation.grants) if g.container == container and g.device_ids]
        named.sort(key=lambda i: allocation.grants[i].init)  # app containers before init ones
        if named:
            return Slot(allocation, named[0])
    return None


def _guard(ledger: NodeLedger | None, ref: GrantRef, expected: frozenset[str]) -> NodeLedger:
    found = ledger.get(ref[0]) if ledger is not None else None
    if ledger is None or found is None or frozenset(found.grants[ref[1]].device_ids) != expected:
        raise Conflict("the ledger changed since the comparison; next round")
    return ledger


def _commit(allocation_id: AllocationId, now: float) -> Repair:
    return lambda ledger: None if ledger is None else commit(ledger, allocation_id, now)


def _rehome(ref: GrantRef, expected: frozenset[str], ids: frozenset[str]) -> Repair:
    return lambda ledger: rehome(_guard(ledger, ref, expected), ref, ids)


def _swap(ref: GrantRef, own: Slot, other: Slot) -> Repair:
    theirs = (other.allocation.id, other.index)

    def repair(ledger: NodeLedger | None) -> NodeLedger:
        checked = _guard(_guard(ledger, ref, own.ids), theirs, other.ids)
        return swap(checked, ref, theirs)

    return repair
