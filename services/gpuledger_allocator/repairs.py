"""What reconciling a node's ledger with Kubernetes changes, as pure functions over one pod listing.

Two repairs, both decided again inside each compare-and-set on the node's current ledger:

- **release**: a live allocation owned by a pod (``Owner.id`` is the pod's UID) whose pod is not in
  the listing ("pod deleted"), has finished ("pod finished"), or is bound carrying another
  allocation in its annotation (a leftover of a bind attempt that died halfway). A pod missing from
  the listing may have been created after the listing began, so an allocation created less than
  ``grace_s`` before the listing started is left alone.
- **rebuild**: a pod placed on the node, with the ``gpuledger.io/allocation`` annotation, whose
  allocation the ledger does not hold (the bucket was lost) gets it back, bound, if its cards are on
  the node and it fits beside what is there; otherwise it is a conflict, reported and left alone.
  A Running pod is always rebuilt; a Pending one only while the annotation's lease runs (after it, a
  pod kubelet never admitted must not hold cards; one it did admit is rebuilt once Running).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpuledger_core.errors import GpuledgerError
from gpuledger_core.ids import AllocationId, PodUid
from gpuledger_core.ledger import NodeLedger, commit, release, reserve
from gpuledger_core.model import Allocation, AllocState, OwnerKind

POD_DELETED = "pod deleted"
POD_FINISHED = "pod finished"
POD_HOLDS_ANOTHER = "its pod is bound with another allocation"
FINISHED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class PodSeen:
    """One pod as the listing showed it (converted once, at the Kubernetes adapter)."""

    uid: PodUid
    namespace: str
    name: str
    phase: str  # Pending, Running, Succeeded, Failed or Unknown
    node: str = ""  # spec.nodeName: empty until bound
    allocation: Allocation | None = None  # from the gpuledger.io/allocation annotation

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES


@dataclass(frozen=True, slots=True)
class Listing:
    """Every pod in the cluster, from one complete listing."""

    pods: Mapping[PodUid, PodSeen]
    started_at: float  # wall clock just before the first page was asked for
    annotated: Mapping[str, tuple[PodSeen, ...]]  # node -> its pods that carry an allocation

    @classmethod
    def of(cls, pods: Iterable[PodSeen], started_at: float) -> Listing:
        by_uid = {p.uid: p for p in pods}
        annotated: dict[str, list[PodSeen]] = {}
        for pod in by_uid.values():
            if pod.node and pod.allocation is not None:
                annotated.setdefault(pod.node, []).append(pod)
        return cls(by_uid, started_at, {node: tuple(found) for node, found in annotated.items()})


@dataclass(frozen=True, slots=True)
class Outcome:
    """The node's ledger after reconciling, and what changed or could not be done."""

    ledger: NodeLedger
    released: tuple[tuple[AllocationId, str], ...] = ()  # (allocation, reason)
    rebuilt: tuple[AllocationId, ...] = ()
    conflicts: tuple[tuple[AllocationId, str], ...] = ()  # (allocation, why it was not rebuilt)


def release_reason(allocation: Allocation, listing: Listing, grace_s: float) -> str:
    """Why ``allocation`` is to be released now; empty to keep it."""
    if not allocation.live or allocation.owner.kind is not OwnerKind.POD:
        return ""
    pod = listing.pods.get(PodUid(allocation.owner.id))
    if pod is None:
        return POD_DELETED if allocation.created_at <= listing.started_at - grace_s else ""
    if pod.finished:
        return POD_FINISHED
    if pod.node and pod.allocation is not None and pod.allocation.id != allocation.id:
        # The Binding wrote the node and the annotation together, so this one lost: e.g. a bind
        # that died after its reservation and before its owner record, followed by a retry.
        return POD_HOLDS_ANOTHER
    return ""


def wants_rebuild(ledger: NodeLedger, pod: PodSeen, now: float) -> Allocation | None:
    """The pod's annotated allocation, if it belongs on this node and the ledger lost it."""
    allocation = pod.allocation
    if allocation is None or pod.node != ledger.node.name or not _holds_cards(pod, allocation, now):
        return None
    if ledger.get(allocation.id) is not None or ledger.of_owner(allocation.owner.key) is not None:
        return None  # still there (live or released): never overwritten, never revived
    return allocation


def _holds_cards(pod: PodSeen, allocation: Allocation, now: float) -> bool:
    if pod.phase == "Running":
        return True
    lease = allocation.lease_expires_at
    return pod.phase == "Pending" and (allocation.state is AllocState.BOUND or (lease is not None and lease > now))


def restore(ledger: NodeLedger, allocation: Allocation, now: float) -> NodeLedger:
    """Put a lost allocation back, bound, keeping its cards and device IDs. Raises (``Exhausted``,
    ``InvalidArgument``, ``FailedPrecondition``) when it is not for this node or does not fit."""
    fresh = replace(allocation, state=AllocState.RESERVED, lease_expires_at=None, reason="")
    return commit(reserve(ledger, fresh), allocation.id, now)


def reconciled(ledger: NodeLedger, listing: Listing, grace_s: float, now: float) -> Outcome:
    """Releases first (they make room), then rebuilds."""
    released: list[tuple[AllocationId, str]] = []
    for allocation in ledger.live():
        reason = release_reason(allocation, listing, grace_s)
        if reason:
            ledger = release(ledger, allocation.id, now, reason)
            released.append((allocation.id, reason))
    rebuilt: list[AllocationId] = []
    conflicts: list[tuple[AllocationId, str]] = []
    for pod in listing.annotated.get(ledger.node.name, ()):
        lost = wants_rebuild(ledger, pod, now)
        if lost is None:
            continue
        problem = _ownership_problem(pod, lost)
        try:
            if problem:
                conflicts.append((lost.id, problem))
                continue
            ledger = restore(ledger, lost, now)
            rebuilt.append(lost.id)
        except GpuledgerError as err:
            conflicts.append((lost.id, str(err)))
    return Outcome(ledger, tuple(released), tuple(rebuilt), tuple(conflicts))


def _ownership_problem(pod: PodSeen, allocation: Allocation) -> str:
    owner = allocation.owner
    if owner.kind is not OwnerKind.POD or owner.id != pod.uid:
        return f"pod {pod.namespace}/{pod.name} ({pod.uid}) carries the allocation of {owner.describe()}"
    return ""
