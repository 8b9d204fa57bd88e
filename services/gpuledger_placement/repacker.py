"""Defragmentation in placement, off by default (setting ``defrag``; docs/preemption.md,
"Defragmentation"): for a pod that fits nowhere and that preemption cannot help, move a few
movable pods to other nodes so that it fits, and let their controllers recreate them where they
fit again (``gpuledger_core.repack`` chooses; the preemptor evicts, holds the room and tells).

A pod may be moved only when all of these hold:

- it says so: the label ``gpuledger.io/movable: "true"``;
- a controller recreates it (an owner reference with ``controller: true``: a ReplicaSet, a
  StatefulSet, a Job...); a bare pod evicted would be gone for good;
- it is bound, not being deleted, and of no higher priority than the pod it makes room for;
- no pod of its controller was moved within ``cooldown_s`` (a moved pod comes back with a new
  name under the same controller, so the controller is what is remembered);
- a PodDisruptionBudget that selects it allows a disruption (it is ranked as protected otherwise,
  and the Eviction API refuses it: nothing is forced).

A movable pod's cards may be held by itself (classic mode) or by the claims kube-controller-manager
made for it from its templates and the ledger allocated (DRA mode C): such a claim moves with its
pod (it goes when the pod goes; the recreated pod's new claim is allocated where it fits). A claim
that is not the pod's own (shared, or allocated by kube-scheduler) never moves.

At most ``max_moves`` pods are moved for one pod, and ``moves_per_hour`` in all per placement
replica (the budget is each replica's own). Every move is counted
(``gpuledger_placement_defrag_moves_total``) and told in Events: ``GpuledgerMoved`` on the moved
pod, ``GpuledgerDefragmenting`` on the pod it made room for.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger_core.model import OwnerKind
from gpuledger_core.preemption import Holder
from gpuledger_placement.claim_fields import ALLOCATED_BY_LEDGER

MOVABLE_LABEL = "gpuledger.io/movable"
HOUR_S = 3600.0


@dataclass(slots=True)
class Defrag:
    """The limits of defragmentation and what it has moved lately."""

    max_moves: int = 2
    moves_per_hour: int = 10
    cooldown_s: float = HOUR_S
    clock: Callable[[], float] = time.time
    _moves: deque[float] = field(default_factory=deque)  # when each move of the last hour was made
    _moved: dict[str, float] = field(default_factory=dict)  # controller uid -> when a pod of it was moved

    def budget(self) -> int:
        """How many pods may be moved for the next pod now."""
        now = self.clock()
        while self._moves and now - self._moves[0] >= HOUR_S:
            self._moves.popleft()
        for key in [k for k, at in self._moved.items() if now - at >= self.cooldown_s]:
            del self._moved[key]
        return max(0, min(self.max_moves, self.moves_per_hour - len(self._moves)))

    def movable(
        self,
        pods: Iterable[Mapping[str, Any]],
        priority: int,
        holder: Callable[[Mapping[str, Any]], Holder],
        claims: Iterable[Mapping[str, Any]] = (),
    ) -> tuple[dict[str, Holder], dict[str, Mapping[str, Any]]]:
        """The pods that may be moved for a pod of ``priority``, as holders (by owner key) and by
        uid, each with its own mode-C claims among ``claims`` (``own_claims``; by the claim's uid,
        the pod's raw)."""
        named = {((c.get("metadata") or {}).get("namespace"), (c.get("metadata") or {}).get("name")): c for c in claims}
        now = self.clock()
        holders: dict[str, Holder] = {}
        raws: dict[str, Mapping[str, Any]] = {}
        for pod in pods:
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            owner = controller_of(pod)
            if (meta.get("labels") or {}).get(MOVABLE_LABEL) != "true" or owner is None:
                continue
            if not spec.get("nodeName") or meta.get("deletionTimestamp"):
                continue
            if now - self._moved.get(owner, float("-inf")) < self.cooldown_s:
                continue
            found = holder(pod)
            if found.priority > priority:
                continue
            holders[f"{OwnerKind.POD}:{meta['uid']}"] = found
            raws[str(meta["uid"])] = pod
            for uid in own_claims(pod, named):
                holders[f"{OwnerKind.CLAIM}:{uid}"] = found
                raws[uid] = pod
        return holders, raws

    def moved(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """Count these pods as moved now (the budget, the cool-down of their controllers)."""
        now = self.clock()
        for pod in pods:
            self._moves.append(now)
            owner = controller_of(pod)
            if owner is not None:
                self._moved[owner] = now


def own_claims(pod: Mapping[str, Any], claims: Mapping[tuple[Any, Any], Mapping[str, Any]]) -> list[str]:
    """The uids of the claims made for ``pod`` from its templates (the pod their controller, named
    in its ``resourceClaimStatuses``) that the ledger allocated (mode C's finalizer)."""
    meta = pod.get("metadata") or {}
    found = []
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        claim = claims.get((meta.get("namespace"), status.get("resourceClaimName")))
        if claim is None:
            continue
        cmeta = claim.get("metadata") or {}
        refs = cmeta.get("ownerReferences") or []
        made_for = any(r.get("controller") and r.get("uid") == meta.get("uid") for r in refs)
        if made_for and ALLOCATED_BY_LEDGER in (cmeta.get("finalizers") or []):
            found.append(str(cmeta["uid"]))
    return found


def controller_of(pod: Mapping[str, Any]) -> str | None:
    """The uid of the controller that recreates the pod; None for a pod nothing recreates."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("uid"):
            return str(ref["uid"])
    return None
