"""Mode B with MIG, against a real nats-server: the claims controller reserves a claim that
kube-scheduler allocated to a MIG placement's device as that placement in the node's ledger
(``CardShare.mig``) and commits it; a claim allocated to a placement that overlaps it is rejected
with the ledger's reason. Mode C places a MIG claim by the MIG asks placement has seen, as the
extender places a pod, and counts the claim among them. The API server is the double of
test_claims_mode_c."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

import pytest
from nats.aio.client import Client

from gpuledger_common.inventory_api import MadeMig
from gpuledger_common.store import LedgerStore
from gpuledger_core.claim_asks import claim_ask
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import FailedPrecondition, Unavailable
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.mig_place import MigAsks, MigChooser
from gpuledger_core.model import Card, CardMode, MigSlot, Node, Request
from gpuledger_core.packing import make_policy
from gpuledger_core.pods import PodAsk
from gpuledger_placement.claim_allocator import ClaimAllocator
from gpuledger_placement.claims import DRIVER, ClaimsController, claim_path
from gpuledger_placement.view import FleetView
from tests.integration.placement.test_claims_mode_c import NS, Objects, world

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
MIG_CLASS = "mig.gpu.gpuledger.io"
HAS_PROFILE = f'device.driver == "{DRIVER}" && has(device.attributes["{DRIVER}"].profile)'
CLASSES: dict[str, Any] = {
    MIG_CLASS: {"metadata": {"name": MIG_CLASS}, "spec": {"selectors": [{"cel": {"expression": HAS_PROFILE}}]}}
}
NODE = Node(NodeName("a100-mig"), (replace(Card(CardUuid("GPU-m0"), 0, "NVIDIA A100-SXM4-40GB", 40960, minor=0),
                                             mode=CardMode.MIG),))  # fmt: skip


async def in_ledger(store: LedgerStore, view: FleetView) -> None:
    """The MIG node written in the ledger as its inventory reports it, and seen by the view."""
    written = await store.mutate(NODE.name, lambda _: NodeLedger(NODE))
    assert written.new is not None
    view.apply(NODE.name, written.new, written.revision)


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
    await in_ledger(store, view)
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


def gated_pod(claim: str) -> dict[str, Any]:
    """A pod gated for mode C, using the claim by name (no CPU or memory asked)."""
    return {
        "metadata": {"namespace": NS, "name": f"pod-{claim}", "uid": f"pod-{claim}"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}], "containers": [{"name": "app"}]},
    }


@pytest.mark.parametrize(
    ("asked_before", "start"),
    [((), 6), (("4g.20gb",), 4)],  # every profile alike: the last two slices; a workload of 4g: beside the 4g's half
)
async def test_mode_c_places_a_mig_claim_by_the_mig_asks_placement_has_seen_and_counts_the_claim_among_them(
    nc: Client, asked_before: tuple[str, ...], start: int
) -> None:
    api, store, view, controller = await world(nc)
    await in_ledger(store, view)
    asks = MigAsks()
    for profile in asked_before:
        asks.observe(Request(1, mig=profile))
    seen: list[PodAsk] = []
    allocator = ClaimAllocator(
        cast(Any, api), controller, view, lambda: make_policy("default"), chooser=lambda: MigChooser(asks.workload()),
        observe=seen.append,
    )  # fmt: skip
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "1g.10gb"'}}
    raw = api.put(claim_path(ClaimRef(NS, "small", "uid-small")), {
        "metadata": {"namespace": NS, "name": "small", "uid": "uid-small"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": MIG_CLASS, "selectors": [selector]}}]}},
    })  # fmt: skip
    classes = {
        MIG_CLASS: {
            "metadata": {"name": MIG_CLASS},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f'device.driver == "{DRIVER}" && has(device.attributes["{DRIVER}"].profile)'
                        }
                    }
                ]
            },
        }
    }
    ask = claim_ask(raw, classes, DRIVER)
    assert ask is not None
    await allocator._allocate(gated_pod("small"), raw, ask, classes)
    ledger, _ = await store.read(NODE.name)
    entry = ledger.of_owner("claim:uid-small") if ledger is not None else None
    assert entry is not None and [s.mig for s in entry.shares()] == [MigSlot("1g.10gb", start, 2)]
    (result,) = api.items[claim_path(ClaimRef(NS, "small", "uid-small"))]["status"]["allocation"]["devices"]["results"]
    assert result["device"] == f"gpu-0-mig-1g-10gb-{start}"
    assert [[c.request.mig for c in p.containers] for p in seen] == [["1g.10gb"]]  # counted as a pod's ask is


class Told(Objects):
    """The API double, recording the events created."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    async def create_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.events.append(dict(body))
        return dict(body)


async def test_mode_c_has_the_node_make_a_mig_instance_before_writing_the_claim_and_rolls_back_if_it_cannot(
    nc: Client,
) -> None:
    _, store, view, _ = await world(nc)
    api = Told()
    controller = ClaimsController(cast(Any, api), store, view)
    await in_ledger(store, view)
    asked: list[tuple[str, str, MigSlot, str]] = []
    broken = True

    async def make(node: str, card: str, slot: MigSlot, holder: str) -> MadeMig:
        asked.append((node, card, slot, holder))
        assert not api.items[claim_path(ClaimRef(NS, "c", "uid-c"))].get("status"), "made before the claim is written"
        if broken:
            raise Unavailable(f"NVML refused: insufficient resources for {slot.profile}")
        return MadeMig("MIG-made", 1, 0, 0, 0)

    controller.make = make
    allocator = ClaimAllocator(cast(Any, api), controller, view, lambda: make_policy("default"))
    raw = api.put(claim_path(ClaimRef(NS, "c", "uid-c")), {
        "metadata": {"namespace": NS, "name": "c", "uid": "uid-c"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": MIG_CLASS, "selectors": [
            {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "3g.20gb"'}}]}}]}},
    })  # fmt: skip
    ask = claim_ask(raw, CLASSES, DRIVER)
    assert ask is not None
    with pytest.raises(FailedPrecondition, match=r"MIG instance 3g.20gb at \d on card 0 \(GPU-m0\) of node a100-mig"):
        await allocator._allocate(gated_pod("c"), raw, ask, CLASSES)
    ((node, card, slot, holder),) = asked
    assert (node, card, slot.profile) == ("a100-mig", "GPU-m0", "3g.20gb")
    ledger, _ = await store.read(NODE.name)
    assert ledger is not None and ledger.of_owner("claim:uid-c") is None  # rolled back
    released = ledger.get(AllocationId(holder))
    assert released is None or not released.live
    assert not api.items[claim_path(ClaimRef(NS, "c", "uid-c"))].get("status")  # never written
    (event,) = api.events
    assert event["reason"] == "GpuledgerMigNotMade" and "NVML refused" in event["message"]
    broken = False
    await allocator._allocate(gated_pod("c"), api.items[claim_path(ClaimRef(NS, "c", "uid-c"))], ask, CLASSES)
    ledger, _ = await store.read(NODE.name)
    entry = ledger.of_owner("claim:uid-c") if ledger is not None else None
    assert entry is not None and asked[-1][3] == entry.id  # made for the entry that holds it
    assert api.items[claim_path(ClaimRef(NS, "c", "uid-c"))]["status"]["allocation"]


async def test_mode_b_has_the_node_make_a_mig_instance_before_committing_and_rejects_the_claim_if_it_cannot(
    nc: Client,
) -> None:
    api, store, view, controller = await world(nc)
    await in_ledger(store, view)
    asked: list[str] = []

    async def make(node: str, card: str, slot: MigSlot, holder: str) -> MadeMig:
        asked.append(f"{slot.profile}@{slot.start} for {holder}")
        if slot.start == 4:
            raise Unavailable("NVML refused: in use")
        return MadeMig("MIG-made", 2, 0, 0, 0)

    controller.make = make
    for name, device in (("bad", "gpu-0-mig-3g-20gb-4"), ("good", "gpu-0-mig-3g-20gb-0")):
        await controller.settle(api.put(claim_path(ClaimRef(NS, name, f"uid-{name}")), scheduled(name, device)))
    ledger, _ = await store.read(NODE.name)
    assert ledger is not None and ledger.of_owner("claim:uid-bad") is None  # rolled back
    good = ledger.of_owner("claim:uid-good")
    assert good is not None and asked[-1] == f"3g.20gb@0 for {good.id}"
    (bad,) = api.items[claim_path(ClaimRef(NS, "bad", "uid-bad"))]["status"]["devices"]
    ((kind, status, reason, message),) = [
        (c["type"], c["status"], c["reason"], c["message"]) for c in bad["conditions"]
    ]
    assert (kind, status, reason) == ("gpuledger.io/rejected", "True", "MigNotMade")
    assert "3g.20gb at 4 on card 0 (GPU-m0) of node a100-mig could not be made: NVML refused" in message
    (fine,) = api.items[claim_path(ClaimRef(NS, "good", "uid-good"))]["status"]["devices"]
    assert [(c["type"], c["status"]) for c in fine["conditions"]] == [("gpuledger.io/committed", "True")]
