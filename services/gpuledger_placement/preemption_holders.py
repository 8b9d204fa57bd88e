"""The holders a preemption may evict, as the API server lists them (preemptor.py, step 2): every
pod on the candidate nodes that is not going already (its priority, start, PodDisruptionBudget and
host requests) and every claim held there whose pods are all among them (mode C's, or kube-
scheduler's that the ledger committed). What each listing learns of a pod or claim (its priority,
grace period, consumers, a mode-B claim to veto) is kept on the preemptor for the steps after."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import NodeName
from gpuledger_core.model import OwnerKind
from gpuledger_core.preemption import Holder
from gpuledger_placement import claim_veto
from gpuledger_placement.claims import ALLOCATED_BY_LEDGER, DRIVER
from gpuledger_placement.convert import epoch_of, host_requests
from gpuledger_placement.node_fit import selects

if TYPE_CHECKING:
    from gpuledger_placement.preemptor import Preemptor

DEFAULT_GRACE_S = 30.0  # a pod's terminationGracePeriodSeconds when it names none
PDBS = "/apis/policy/v1/poddisruptionbudgets"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


class ListApi(Protocol):
    async def list_objects(self, path: str, params: Mapping[str, str]) -> dict[str, Any]: ...


@dataclass(slots=True)
class Listings:
    """The cluster-wide lists one attempt of preemption reads (PodDisruptionBudgets, claims), each
    read once in the attempt: choosing victims and then, where none help, defragmentation read
    the same ones."""

    api: ListApi
    _found: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)

    async def items(self, path: str) -> list[Mapping[str, Any]]:
        if path not in self._found:
            self._found[path] = list((await self.api.list_objects(path, {})).get("items") or [])
        return self._found[path]


async def holders(
    preemptor: Preemptor, nodes: Sequence[NodeName], listings: Listings | None = None
) -> dict[str, Holder]:
    """Every pod on ``nodes`` that is not going already: priority, start, budget; and every
    claim held there whose pods are all among them (its priority their highest, protected if
    one of them is, started with the first)."""
    listings = listings or Listings(preemptor.api)
    pods: list[Mapping[str, Any]] = []
    for node in nodes:
        listed = await preemptor.api.list_objects("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
        pods += [p for p in listed.get("items") or [] if not (p.get("metadata") or {}).get("deletionTimestamp")]
    budgets = await listings.items(PDBS)
    live = {a.owner.id for e in preemptor.service.view.entries.values() for a in e.ledger.live()}
    for uid in [u for u in preemptor._priorities if u not in live]:
        del preemptor._priorities[uid]  # a pod's priority never changes; a gone pod's is dropped
    for p in pods:
        preemptor._priorities[str(p["metadata"]["uid"])] = priority_of(p)
        grace = (p.get("spec") or {}).get("terminationGracePeriodSeconds")
        preemptor._graces[str(p["metadata"]["uid"])] = float(grace) if isinstance(grace, int) else DEFAULT_GRACE_S
    found = {f"{OwnerKind.POD}:{p['metadata']['uid']}": holder_of(p, budgets) for p in pods}
    return {**found, **await _claim_holders(preemptor, nodes, pods, found, listings)}


async def _claim_holders(
    preemptor: Preemptor,
    nodes: Sequence[NodeName],
    pods: Sequence[Mapping[str, Any]],
    holders: Mapping[str, Holder],
    listings: Listings,
) -> dict[str, Holder]:
    view = preemptor.service.view
    held = {a.owner.id for n in nodes if (e := view.entries.get(n)) for a in e.ledger.live()
            if a.owner.kind is OwnerKind.CLAIM}  # fmt: skip
    if not held:
        return {}
    by_uid = {str(p["metadata"]["uid"]): p for p in pods}
    found: dict[str, Holder] = {}
    for claim in await listings.items(CLAIMS):
        uid = str((claim.get("metadata") or {}).get("uid") or "")
        users = [str(r.get("uid")) for r in (claim.get("status") or {}).get("reservedFor") or []]
        if uid not in held or not users or any(u not in by_uid for u in users):
            continue  # not held here, or used by a pod that is not running here (or is going)
        preemptor._mode_b.pop(uid, None)
        if ALLOCATED_BY_LEDGER not in ((claim.get("metadata") or {}).get("finalizers") or []):
            if not claim_veto.mode_b(claim, DRIVER):
                continue  # mirrored only (mode A), or not committed: nothing would keep its pods off the cards
            preemptor._mode_b[uid] = claim  # kube-scheduler's: vetoed before its pods are evicted
        mine = [holders[f"{OwnerKind.POD}:{u}"] for u in users]
        preemptor._priorities[uid] = max(h.priority for h in mine)
        preemptor._graces[uid] = max(preemptor._graces.get(u, DEFAULT_GRACE_S) for u in users)
        preemptor._consumers[uid] = tuple(pod_ref(by_uid[u]["metadata"]["namespace"], by_uid[u]["metadata"]["name"], u)
                                          for u in users)  # fmt: skip
        found[f"{OwnerKind.CLAIM}:{uid}"] = Holder(
            preemptor._priorities[uid],
            any(h.protected for h in mine),
            min(h.started_at for h in mine),
            sum(h.cpu_milli for h in mine),
            sum(h.memory_mib for h in mine),
        )
    return found


def priority_of(pod: Mapping[str, Any]) -> int:
    """The pod's priority as admission resolved it (0 without a priority class or a global default)."""
    value = (pod.get("spec") or {}).get("priority")
    return int(value) if isinstance(value, int) else 0


def holder_of(pod: Mapping[str, Any], budgets: Sequence[Mapping[str, Any]]) -> Holder:
    """A running pod as a possible victim: its priority, whether a PodDisruptionBudget of its
    namespace selecting it allows no disruption now, when it started, and the CPU and memory its
    eviction frees on the host (none counted for a request that is no quantity)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    protected = any(
        (b.get("metadata") or {}).get("namespace") == meta.get("namespace")
        and selects((b.get("spec") or {}).get("selector"), labels)
        and int((b.get("status") or {}).get("disruptionsAllowed") or 0) <= 0
        for b in budgets
    )
    started = (pod.get("status") or {}).get("startTime") or meta.get("creationTimestamp")
    try:
        cpu_milli, memory_mib = host_requests(pod)
    except InvalidArgument:
        cpu_milli, memory_mib = 0, 0
    return Holder(priority_of(pod), protected, epoch_of(started, 0.0), cpu_milli, memory_mib)


def pod_ref(namespace: str, name: str, uid: str) -> str:
    return f"{namespace}/{name}/{uid}"
