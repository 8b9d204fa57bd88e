"""The claims controller and a claim kube-scheduler allocated (mode B) whose ledger entry preemption
took back, against a real nats-server: the entry is not held again and the claim's devices say
``gpuledger.io/rejected`` (reason Preempted), so that no further pod is bound onto the held cards;
once kube-scheduler allocates the claim again (a later allocationTimestamp), the same devices
included, the ledger holds it anew and commits it."""

from __future__ import annotations

import time
from typing import Any

from nats.aio.client import Client

from gpuledger_core import claims
from gpuledger_core.claims import ClaimRef
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger, release
from gpuledger_core.preemption import PREEMPTED_BY
from gpuledger_dev.fleet import Fleet
from gpuledger_placement import claim_veto
from gpuledger_placement.claim_fields import COMMITTED, REJECTED, decided
from gpuledger_placement.claims import DRIVER, claim_path
from tests.integration.placement.test_claims_mode_c import NS, Objects, big, held, stamp, world

DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"  # kube-scheduler's finalizer


def committed(api: Objects, node: NodeName, allocated_at: float) -> dict[str, Any]:
    """Claim ``b`` as kube-scheduler allocates it (card 0, the binding condition), reserved for its
    pod, with ``committed`` written."""
    ref = ClaimRef(NS, "b", "uid-b")
    result = {"request": "gpu", "driver": DRIVER, "pool": str(node), "device": "gpu-0",
              "bindingConditions": [COMMITTED], "bindingFailureConditions": [REJECTED]}  # fmt: skip
    condition = {"type": COMMITTED, "status": "True", "reason": "Reserved", "message": "ledger allocation"}
    body = {
        "metadata": {"namespace": NS, "name": "b", "uid": ref.uid, "finalizers": [DELETE_PROTECTION]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {
            "allocation": {"devices": {"results": [result]}, "allocationTimestamp": stamp(allocated_at)},
            "reservedFor": [{"resource": "pods", "name": "b", "uid": "pod-b"}],
            "devices": [{"driver": DRIVER, "pool": str(node), "device": "gpu-0", "conditions": [condition]}],
        },
    }
    return api.put(claim_path(ref), body)


async def test_a_preempted_mode_b_claim_is_rejected_not_held_and_held_again_once_allocated_anew(
    nc: Client, fleet: Fleet
) -> None:
    api, store, view, controller = await world(nc)
    node = big(fleet)
    now = time.time()
    raw = committed(api, node.name, now - 60)
    devices = claims.results_of(raw, DRIVER)
    entry = claims.ledger_allocation(claims.ref_of(raw), devices, node, now - 60)

    def taken_back(ledger: NodeLedger | None) -> NodeLedger:
        held_there = NodeLedger(node, (*(ledger.allocations if ledger is not None else ()), entry))
        return release(held_there, entry.id, now - 5, f"{PREEMPTED_BY}pod {NS}/high")

    written = await store.mutate(node.name, taken_back)
    assert written.new is not None
    view.apply(node.name, written.new, written.revision)

    await controller.settle(raw)  # a version from before the veto (or no veto was written)
    stored = api.items[claim_path(claims.ref_of(raw))]
    assert decided(stored, DRIVER, devices) == REJECTED and claim_veto.is_vetoed(stored, DRIVER)
    assert await held(store, fleet, "uid-b") is None  # not held again: the room is the preemptor's

    again = dict(stored)  # kube-controller-manager deallocated it; kube-scheduler allocates it again
    again["status"] = {**committed(api, node.name, now)["status"], "devices": []}
    raw = api.put(claim_path(claims.ref_of(raw)), again)
    await controller.settle(raw)
    assert await held(store, fleet, "uid-b") == entry.id  # the same devices, a new allocation: held
    stored = api.items[claim_path(claims.ref_of(raw))]
    assert decided(stored, DRIVER, devices) == COMMITTED
