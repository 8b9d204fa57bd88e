"""Mode B with MIG, against a real nats-server: the claims controller reserves a claim that
kube-scheduler allocated to a MIG placement's device as that placement in the node's ledger
(``CardShare.mig``) and commits it; a claim allocated to a placement that overlaps it is rejected
with the ledger's reason. The API server is the double of test_claims_mode_c."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from nats.aio.client import Client

from gpuledger_core.claims import ClaimRef
from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Card, CardMode, MigSlot, Node
from gpuledger_placement.claims import DRIVER, claim_path
from tests.integration.placement.test_claims_mode_c import NS, world

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODE = Node(NodeName("a100-mig"), (replace(Card(CardUuid("GPU-m0"), 0, "NVIDIA A100-SXM4-40GB", 40960, minor=0),
                                             mode=CardMode.MIG),))  # fmt: skip


def scheduled(name: str, device: str) -> dict[str, Any]:
    """A claim as kube-scheduler leaves it at PreBind: allocated, reserved, waiting for our condition."""
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": str(NODE.name),
        "device": device,
        "bindingConditions": ["gpuledger.io/committed"],
        "bindingFailureConditions": ["gpuledger.io/rejected"],
    }
    return {
        "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.gpu.gpuledger.io"}}]}},
        "status": {"allocation": {"devices": {"results": [result]}, "allocationTimestamp": "2026-01-01T00:00:00Z"},
                   "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": f"pod-{name}"}]},
    }  # fmt: skip


async def test_a_placement_kube_scheduler_chose_is_reserved_as_itself_and_an_overlapping_one_rejected(
    nc: Client,
) -> None:
    api, store, view, controller = await world(nc)
    written = await store.mutate(NODE.name, lambda _: NodeLedger(NODE))
    assert written.new is not None
    view.apply(NODE.name, written.new, written.revision)
    first = api.put(claim_path(ClaimRef(NS, "half", "uid-half")), scheduled("half", "gpu-0-mig-3g-20gb-4"))
    await controller.settle(first)
    ledger, _ = await store.read(NODE.name)
    assert ledger is not None
    entry = ledger.of_owner("claim:uid-half")
    assert entry is not None
    (share,) = entry.shares()
    assert share.mig == MigSlot("3g.20gb", 4, 4) and share.uuid == "GPU-m0"
    (status,) = api.items[claim_path(ClaimRef(NS, "half", "uid-half"))]["status"]["devices"]
    assert status["device"] == "gpu-0-mig-3g-20gb-4"
    assert {(c["type"], c["status"]) for c in status["conditions"]} == {("gpuledger.io/committed", "True")}
    second = api.put(claim_path(ClaimRef(NS, "whole", "uid-whole")), scheduled("whole", "gpu-0-mig-7g-40gb-0"))
    await controller.settle(second)
    (refused,) = api.items[claim_path(ClaimRef(NS, "whole", "uid-whole"))]["status"]["devices"]
    (condition,) = refused["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "gpuledger.io/rejected",
        "True",
        "LedgerRefused",
    )
    assert "7g.40gb at 0 overlaps 3g.20gb at 4, which is held" in condition["message"]
    ledger, _ = await store.read(NODE.name)
    assert ledger is not None and ledger.of_owner("claim:uid-whole") is None
