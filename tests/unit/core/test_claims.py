"""A DRA claim's allocation results as the ledger holds them (gpuledger_core.claims)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_core import claims
from gpuledger_core.claims import AllocatedDevice, ClaimRef
from gpuledger_core.errors import Exhausted, InvalidArgument
from gpuledger_core.ledger import reserve
from gpuledger_core.model import CORE_WHOLE, AllocState, Isolation, OwnerKind
from tests.unit.core.builders import NODE, ledger, node

REF = ClaimRef("ns", "train", "uid-1")
GiB = 1 << 30


def device(name: str = "gpu-0", share: str | None = "s-1", memory: int | None = 10 * GiB, compute: int | None = 25,
           request: str = "gpu") -> AllocatedDevice:  # fmt: skip
    return AllocatedDevice(request, NODE, name, share, memory, compute)


def test_a_share_holds_what_it_consumed_in_whole_mib_and_per_mille() -> None:
    found = claims.ledger_allocation(REF, [device(memory=10 * GiB + 1)], node(81559), now=5.0)
    (share,) = found.shares()
    assert (share.index, share.mem_mib, share.core_milli, share.exclusive) == (0, 10241, 250, False)
    assert found.owner.kind is OwnerKind.CLAIM and found.owner.key == "claim:uid-1"
    assert found.owner.describe() == "claim ns/train"
    assert found.state is AllocState.BOUND and found.lease_expires_at is None


@pytest.mark.parametrize(
    "taken",
    [
        device(share=None, memory=None, compute=None),  # a device that takes one allocation
        device(memory=81408 << 20, compute=100),  # every default of a shared device: the published whole
    ],
)
def test_a_device_held_whole_is_exclusive_in_the_ledger(taken: AllocatedDevice) -> None:
    (share,) = claims.ledger_allocation(REF, [taken], node(81559), now=0.0).shares()
    assert share.exclusive and share.mem_mib == 81559 and share.core_milli == CORE_WHOLE


def test_a_share_just_below_the_whole_stays_a_share() -> None:
    (share,) = claims.ledger_allocation(REF, [device(memory=81408 << 20, compute=99)], node(81559), 0.0).shares()
    assert not share.exclusive and share.core_milli == 990


def test_one_grant_per_request_and_the_same_id_for_the_same_devices_in_any_order() -> None:
    a, b, c = (
        device("gpu-0", request="main"),
        device("gpu-1", "s-2", request="main"),
        device("gpu-2", None, None, None, "aux"),
    )
    found = claims.ledger_allocation(REF, [a, b, c], node(8000, 8000, 8000), 0.0)
    assert [(g.container, [s.index for s in g.cards]) for g in found.grants] == [("main", [0, 1]), ("aux", [2])]
    assert claims.allocation_id(REF, [c, b, a]) == found.id
    assert claims.allocation_id(REF, [a, b]) != found.id
    assert claims.allocation_id(ClaimRef("ns", "train", "uid-2"), [a, b, c]) != found.id


@pytest.mark.parametrize("name", ["gpu-9", "nic-0", "gpu-x", "0"])
def test_a_device_that_is_no_card_of_the_node_is_refused_by_name(name: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        claims.ledger_allocation(REF, [device(name)], node(8000), 0.0)


def test_a_claim_over_two_pools_is_refused() -> None:
    other = AllocatedDevice("gpu", "node-b", "gpu-0")
    with pytest.raises(InvalidArgument, match="node-a, node-b"):
        claims.node_of(REF, [device(), other])


def test_the_ledger_refuses_a_whole_card_someone_shares_and_a_share_larger_than_the_card() -> None:
    first = claims.ledger_allocation(ClaimRef("ns", "first", "uid-0"), [device(memory=2 * GiB)], node(8000), 0.0)
    held = reserve(ledger(8000), first)
    with pytest.raises(Exhausted, match="held by 1 other"):
        reserve(held, claims.ledger_allocation(REF, [device(share=None)], node(8000), 0.0))
    with pytest.raises(Exhausted, match="needs 10240 MiB"):
        reserve(ledger(8000), claims.ledger_allocation(REF, [device()], node(8000), 0.0))


def test_results_of_takes_our_driver_with_its_binding_conditions() -> None:
    raw: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "train", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu/nvlink", "driver": "gpu.gpuledger.io", "pool": NODE, "device": "gpu-3", "shareID": "s",
             "consumedCapacity": {"memory": "2Gi", "compute": "10", "slots": "1"},
             "bindingConditions": ["gpuledger.io/committed"]},
            {"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "nic-0"},
        ]}}},
    }  # fmt: skip
    (found,) = claims.results_of(raw, "gpu.gpuledger.io")
    assert found == AllocatedDevice("gpu", NODE, "gpu-3", "s", 2 * GiB, 10, ("gpuledger.io/committed",), "gpu/nvlink")
    assert found.key == (NODE, "gpu-3", "s")
    assert claims.results_of({"status": {}}, "gpu.gpuledger.io") == ()


def sharing(isolation: str, *requests: str, source: str = "FromClaim") -> dict[str, Any]:
    parameters = {"apiVersion": "gpuledger.io/v1alpha1", "kind": "SharingConfig", "isolation": isolation}
    return {
        "source": source,
        "requests": list(requests),
        "opaque": {"driver": "gpu.gpuledger.io", "parameters": parameters},
    }


def configured(*configs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "train", "uid": "uid-1"},
            "status": {"allocation": {"devices": {"config": list(configs)}}}}  # fmt: skip


def test_the_isolation_comes_from_the_class_then_the_claim_for_the_devices_requests() -> None:
    gpu, aux = device(request="gpu"), device("gpu-1", request="aux")
    assert claims.isolation_of(configured(), "gpu.gpuledger.io", [gpu]) is Isolation.NONE
    from_class = sharing("mps", "gpu", source="FromClass")
    assert claims.isolation_of(configured(from_class), "gpu.gpuledger.io", [gpu]) is Isolation.MPS
    # The claim's own config comes after the class's and wins, whatever the order listed.
    both = configured(sharing("none", "gpu"), from_class)
    assert claims.isolation_of(both, "gpu.gpuledger.io", [gpu]) is Isolation.NONE
    # A config for another request, or another driver, does not apply.
    assert claims.isolation_of(configured(sharing("mps", "aux")), "gpu.gpuledger.io", [gpu]) is Isolation.NONE
    other = sharing("mps")
    other["opaque"]["driver"] = "net.example.com"
    assert claims.isolation_of(configured(other), "gpu.gpuledger.io", [gpu]) is Isolation.NONE
    with pytest.raises(InvalidArgument, match="none and mps at once"):
        claims.isolation_of(configured(sharing("mps", "aux")), "gpu.gpuledger.io", [gpu, aux])


@pytest.mark.parametrize(
    ("parameters", "says"),
    [
        ({"apiVersion": "gpuledger.io/v1alpha1", "kind": "SharingConfig", "isolation": "hami"}, "must be none|mps"),
        ({"apiVersion": "gpuledger.io/v2", "kind": "SharingConfig"}, "must be gpuledger.io/v1alpha1 SharingConfig"),
        ({"apiVersion": "gpuledger.io/v1alpha1", "kind": "SharingConfig", "mode": "mps"}, "unknown field"),
        ("mps", "must be an object"),
    ],
)
def test_a_bad_sharing_config_is_refused_saying_what_is_wrong(parameters: Any, says: str) -> None:
    config = sharing("mps")
    config["opaque"]["parameters"] = parameters
    with pytest.raises(InvalidArgument, match=says):
        claims.isolation_of(configured(config), "gpu.gpuledger.io", [device()])


def test_an_mps_claim_is_held_with_isolation_mps_and_never_beside_an_unisolated_tenant() -> None:
    mps = claims.ledger_allocation(REF, [device(memory=GiB)], node(8000), 0.0, isolation=Isolation.MPS)
    assert mps.isolation is Isolation.MPS
    other = claims.ledger_allocation(ClaimRef("ns", "b", "uid-2"), [device(memory=GiB)], node(8000), 0.0)
    with pytest.raises(Exhausted, match="mps"):
        reserve(reserve(ledger(8000), mps), other)
