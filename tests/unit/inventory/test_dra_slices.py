"""The node's ResourceSlices built from the domain Node (pure): devices, limits, pool plans, and the
check of what the API server returned."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_core.errors import FailedPrecondition, InvalidArgument
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import (
    Allocation,
    AllocState,
    Card,
    CardShare,
    Grant,
    Health,
    Isolation,
    Link,
    Node,
    Owner,
    OwnerKind,
)
from gpuledger_core.nvlink import nvlink_groups
from gpuledger_inventory.publisher import sysfs_pcie_root
from gpuledger_inventory.slice_fields import binary_quantity, semver
from gpuledger_inventory.slices import (
    MAX_DEVICES_PER_SLICE,
    CardFacts,
    SliceConfig,
    check_returned,
    desired,
    differences,
    held_outside_dra,
    manifest,
    plan,
    sysfs_bus_id,
    tenancy_of,
)


def card(index: int, mib: int = 81920, health: Health = Health.HEALTHY, reason: str = "") -> Card:
    return Card(
        CardUuid(f"GPU-{index:08d}"),
        index,
        "NVIDIA H100 80GB HBM3",
        mib,
        numa=index // 4,
        health=health,
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        health_reason=reason,
    )


def node(n: int = 2, links: tuple[Link, ...] = (), **kw: Any) -> Node:
    return Node(NodeName("h100-0"), tuple(card(i, **kw) for i in range(n)), links)


def mesh(indexes: range, nvlinks: int = 18) -> tuple[Link, ...]:
    return tuple(Link(a, b, nvlinks) for a in indexes for b in indexes if a < b)


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [(0, "0"), (100, "100"), (1024, "1Ki"), (256 << 20, "256Mi"), (24576 << 20, "24Gi"), (15104 << 20, "15104Mi")],
)
def test_byte_counts_are_written_in_the_api_servers_canonical_form(n_bytes: int, text: str) -> None:
    assert binary_quantity(n_bytes) == text


@pytest.mark.parametrize(
    ("raw", "version"),
    [("560.35.03", "560.35.3"), ("550.54.15", "550.54.15"), ("8.6", "8.6.0"), ("535", "535.0.0"), ("n/a", None)],
)
def test_driver_versions_become_semantic_versions(raw: str, version: str | None) -> None:
    assert semver(raw) == version


def test_bus_ids_take_the_sysfs_form_of_the_standard_attribute() -> None:
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_bus_id("0000:3b:00.0") == "0000:3b:00.0"


def test_a_shared_card_is_one_multi_allocatable_device_with_whole_card_defaults() -> None:
    found = desired(node(1), {"GPU-00000000": CardFacts((9, 0), "pci0000:17")}, "560.35.03", SliceConfig())
    (device,) = found.chunks[0]
    assert device["name"] == "gpu-0"
    assert device["allowMultipleAllocations"] is True
    attrs = device["attributes"]
    assert attrs["uuid"] == {"string": "GPU-00000000"}
    assert attrs["productFamily"] == {"string": "hopper"}
    assert attrs["computeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": "560.35.3"}
    assert attrs["memoryMiB"] == {"int": 81920}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.0"}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:17"}
    assert attrs["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert device["capacity"] == {
        "memory": {
            "value": "80Gi",
            "requestPolicy": {"default": "80Gi", "validRange": {"min": "256Mi", "step": "256Mi"}},
        },
        "compute": {"value": "100", "requestPolicy": {"default": "100", "validRange": {"min": "1", "step": "1"}}},
        "slots": {"value": "8", "requestPolicy": {"default": "1", "validValues": ["1"]}},
    }
    assert "taints" not in device and "bindingConditions" not in device
    assert len(attrs) + len(device["capacity"]) <= 32


def test_memory_is_rounded_down_to_whole_steps_so_the_default_is_valid() -> None:
    (device,) = desired(node(1, mib=81559), {}, None, SliceConfig()).chunks[0]
    assert device["capacity"]["memory"]["value"] == "81408Mi"  # 318 steps of 256 MiB
    assert device["capacity"]["memory"]["requestPolicy"]["default"] == "81408Mi"


def test_a_card_that_is_never_shared_has_no_request_policy() -> None:
    (device,) = desired(node(1), {}, None, SliceConfig(slots_per_card=1)).chunks[0]
    assert "allowMultipleAllocations" not in device
    assert all("requestPolicy" not in c for c in device["capacity"].values())


def test_an_unhealthy_card_stays_published_with_a_taint() -> None:
    sick = Node(NodeName("h100-0"), (card(0), card(1, health=Health.UNHEALTHY, reason="XID 79: fell off the bus")))
    devices = desired(sick, {"GPU-00000001": CardFacts(unhealthy_since=1_800_000_000.7)}, None, SliceConfig()).chunks[0]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    assert devices[1]["taints"] == [
        {
            "key": "gpu.gpuledger.io/unhealthy",
            "value": "XID-79-fell-off-the-bus",
            "effect": "NoSchedule",
            "timeAdded": "2027-01-15T08:00:00Z",
        }
    ]


def test_binding_conditions_are_on_every_device_when_asked() -> None:
    devices = desired(node(2), {}, None, SliceConfig(binding_conditions=True)).chunks[0]
    for d in devices:
        assert d["bindingConditions"] == ["gpuledger.io/committed"]
        assert d["bindingFailureConditions"] == ["gpuledger.io/rejected"]


@pytest.mark.parametrize(
    ("links", "size", "groups"),
    [
        (mesh(range(8)), 8, dict.fromkeys(range(8), 0)),
        (mesh(range(8)), 4, {0: 0, 1: 0, 2: 0, 3: 0, 4: 4, 5: 4, 6: 4, 7: 4}),
        (mesh(range(8)), 2, {0: 0, 1: 0, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6, 7: 6}),
        # DGX-1 hybrid cube mesh: two fully linked quads and cross links 0-4, 1-5, 2-6, 3-7
        (
            mesh(range(4)) + mesh(range(4, 8)) + tuple(Link(i, i + 4, 1) for i in range(4)),
            4,
            {0: 0, 1: 0, 2: 0, 3: 0, 4: 4, 5: 4, 6: 4, 7: 4},
        ),
        (mesh(range(4)) + mesh(range(4, 8)) + tuple(Link(i, i + 4, 1) for i in range(4)), 8, {}),
        ((), 2, {}),  # PCIe only
        ((Link(0, 1, 0), Link(1, 2, 4)), 2, {1: 1, 2: 1}),  # a link with no NVLinks joins nothing
    ],
)
def test_nvlink_groups_are_disjoint_fully_linked_sets(
    links: tuple[Link, ...], size: int, groups: dict[int, int]
) -> None:
    assert nvlink_groups(node(8, links), size) == groups


def test_nvlink_groups_reach_the_devices_as_attributes() -> None:
    devices = desired(node(8, mesh(range(8))), {}, None, SliceConfig()).chunks[0]
    assert [d["attributes"]["nvlinkGroup4"]["int"] for d in devices] == [0, 0, 0, 0, 4, 4, 4, 4]
    assert {d["attributes"]["nvlinkGroup8"]["int"] for d in devices} == {0}


def test_more_cards_than_one_slice_holds_make_several_slices_of_one_pool() -> None:
    found = desired(node(MAX_DEVICES_PER_SLICE + 1), {}, None, SliceConfig())
    assert [len(c) for c in found.chunks] == [MAX_DEVICES_PER_SLICE, 1]
    body = manifest(found, 1, 3)
    assert body["spec"]["pool"] == {"name": "h100-0", "generation": 3, "resourceSliceCount": 2}
    assert body["spec"]["nodeName"] == "h100-0" and body["spec"]["driver"] == "gpu.gpuledger.io"


def _stored(body: dict[str, Any], version: str = "7") -> dict[str, Any]:
    """What the API server sends back: the object with fields of its own added."""
    out = {**body, "metadata": {**body["metadata"], "resourceVersion": version, "uid": "u"}}
    out["spec"] = dict(body["spec"])
    return out


OWNER = {"apiVersion": "v1", "kind": "Node", "name": "h100-0", "uid": "node-uid"}


def test_a_fresh_pool_is_created_at_generation_one() -> None:
    todo = plan([], desired(node(2), {}, None, SliceConfig()), OWNER)
    assert todo.generation == 1
    assert [b["metadata"]["name"] for b in todo.create] == ["h100-0-gpuledger-0"]
    assert todo.create[0]["metadata"]["ownerReferences"] == [OWNER]
    assert not todo.update and not todo.delete


def test_an_unchanged_pool_is_not_written_again() -> None:
    slices = desired(node(2), {}, None, SliceConfig())
    existing = [_stored(manifest(slices, 0, 4, OWNER))]
    todo = plan(existing, slices, OWNER)
    assert todo.empty and todo.generation == 4


def test_any_change_bumps_the_generation_and_deletes_slices_beyond_the_count() -> None:
    big = desired(node(MAX_DEVICES_PER_SLICE + 1), {}, None, SliceConfig())
    existing = [_stored(manifest(big, 0, 4, OWNER), "10"), _stored(manifest(big, 1, 4, OWNER), "11")]
    small = desired(node(2), {}, None, SliceConfig())
    todo = plan(existing, small, OWNER)
    assert todo.generation == 5
    assert [b["metadata"]["resourceVersion"] for b in todo.update] == ["10"]
    assert todo.update[0]["spec"]["pool"] == {"name": "h100-0", "generation": 5, "resourceSliceCount": 1}
    assert todo.delete == ("h100-0-gpuledger-1",)


def test_slices_deleted_behind_the_publishers_back_come_back_at_a_later_generation() -> None:
    todo = plan([], desired(node(2), {}, None, SliceConfig()), OWNER, last=4)
    assert todo.generation == 5 and len(todo.create) == 1


def test_a_health_change_is_a_change() -> None:
    slices = desired(node(2), {}, None, SliceConfig())
    existing = [_stored(manifest(slices, 0, 1, OWNER))]
    sick = Node(NodeName("h100-0"), (card(0), card(1, health=Health.UNHEALTHY, reason="XID 79")))
    todo = plan(existing, desired(sick, {}, None, SliceConfig()), OWNER)
    assert todo.generation == 2 and len(todo.update) == 1


def test_fields_the_server_adds_are_no_difference_but_a_dropped_field_is() -> None:
    sent = {"spec": {"devices": [{"name": "gpu-0", "allowMultipleAllocations": True, "taints": [{"key": "k"}]}]}}
    added = {
        "spec": {
            "devices": [
                {
                    "name": "gpu-0",
                    "allowMultipleAllocations": True,
                    "taints": [{"key": "k", "timeAdded": "2026-01-01T00:00:00Z"}],
                }
            ]
        }
    }
    assert differences(sent["spec"], added["spec"]) == []
    dropped = {"spec": {"devices": [{"name": "gpu-0", "taints": [{"key": "k"}]}]}}
    assert differences(sent["spec"], dropped["spec"]) == ["devices[0].allowMultipleAllocations"]


def test_a_dropped_field_fails_naming_it_and_the_gate() -> None:
    body = manifest(desired(node(1), {}, None, SliceConfig()), 0, 1)
    returned = _stored(body)
    device = dict(returned["spec"]["devices"][0])
    del device["allowMultipleAllocations"]
    device["capacity"] = {k: {"value": v["value"]} for k, v in device["capacity"].items()}
    returned["spec"] = {**returned["spec"], "devices": [device]}
    with pytest.raises(FailedPrecondition) as caught:
        check_returned(body, returned)
    text = str(caught.value)
    assert "spec.devices[0].allowMultipleAllocations" in text
    assert "spec.devices[0].capacity.memory.requestPolicy" in text
    assert "DRAConsumableCapacity" in text
    check_returned(body, _stored(body))  # kept as sent: no error


def test_a_memory_step_too_coarse_for_a_card_is_refused_naming_the_setting() -> None:
    with pytest.raises(InvalidArgument, match="dra_memory_step_mib"):
        desired(node(1, mib=300), {}, None, SliceConfig(memory_step_mib=256))


def test_the_pcie_root_is_read_from_the_sysfs_link(tmp_path: Any) -> None:
    devices = tmp_path / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    (devices / "0000:18:00.0").symlink_to("../../../devices/pci0000:17/0000:17:01.0/0000:18:00.0")
    assert sysfs_pcie_root("00000000:18:00.0", str(tmp_path)) == "pci0000:17"
    assert sysfs_pcie_root("00000000:19:00.0", str(tmp_path)) is None


def _holding(owner: Owner, index: int, isolation: Isolation, at: float, exclusive: bool = False) -> Allocation:
    share = CardShare(CardUuid(f"GPU-{index:08d}"), index, 81920 if exclusive else 1024, 1000 if exclusive else 100,
                      exclusive)  # fmt: skip
    return Allocation(
        AllocationId(f"a-{owner.id}"), owner, NodeName("h100-0"), (Grant("", (share,)),),
        state=AllocState.BOUND, isolation=isolation, created_at=at,
    )  # fmt: skip


def test_cards_held_outside_dra_are_tainted_and_every_card_says_its_holders_tier() -> None:
    tool = _holding(Owner(OwnerKind.TOOL, "batch/1"), 0, Isolation.NONE, at=100.0, exclusive=True)
    pod = _holding(Owner(OwnerKind.POD, "p"), 0, Isolation.NONE, at=50.0)
    claim = _holding(Owner(OwnerKind.CLAIM, "c"), 1, Isolation.MPS, at=10.0)
    ledger = NodeLedger(node(3), (tool, pod, claim))
    assert held_outside_dra(ledger) == {"GPU-00000000": 50.0}  # the oldest holder: a stable timeAdded
    assert tenancy_of(ledger) == {"GPU-00000000": "none", "GPU-00000001": "mps"}
    facts = {"GPU-00000000": CardFacts(held_since=50.0, tenancy="none"), "GPU-00000001": CardFacts(tenancy="mps")}
    devices = desired(node(3), facts, None, SliceConfig()).chunks[0]
    assert devices[0]["taints"] == [
        {"key": "gpu.gpuledger.io/held", "value": "outside-dra", "effect": "NoSchedule",
         "timeAdded": "1970-01-01T00:00:50Z"}
    ]  # fmt: skip
    assert "taints" not in devices[1] and "taints" not in devices[2]  # a claim's card is the scheduler's to share
    assert [d["attributes"]["tenancy"] for d in devices] == [{"string": "none"}, {"string": "mps"}, {"string": "idle"}]
    assert held_outside_dra(None) == {} and tenancy_of(None) == {}
