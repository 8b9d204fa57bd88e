"""Slot IDs and their assignment to grants (gpuledger_core.slots)."""

from __future__ import annotations

import pytest

from gpuledger_core import codec
from gpuledger_core.errors import Exhausted, InvalidArgument
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, Card, CardShare, Grant, Node, Owner, OwnerKind
from gpuledger_core.slots import (
    MAX_DEVICE_ID_LEN,
    assign_device_ids,
    card_of,
    device_id,
    free_slots,
    node_slots,
    parse_device_id,
)

UUID = "GPU-2a7d3c1e-5b8f-4a6d-9e0c-1f2b3c4d5e6f"


def node(cards: int = 2) -> Node:
    return Node(
        NodeName("n1"),
        tuple(Card(CardUuid(f"GPU-{i}"), i, "H100", 81920, numa=i % 2) for i in range(cards)),
    )


def alloc(aid: str, *grants: Grant) -> Allocation:
    return Allocation(
        AllocationId(aid), Owner(OwnerKind.POD, f"uid-{aid}", "ns", aid), NodeName("n1"), grants
    )


def share(i: int, mem: int = 1024) -> CardShare:
    return CardShare(CardUuid(f"GPU-{i}"), i, mem, 100)


def test_device_id_round_trips_and_fits_kubelet_limit() -> None:
    raw = device_id(UUID, 99)
    assert raw == f"{UUID}::99"
    assert len(raw) <= MAX_DEVICE_ID_LEN
    assert parse_device_id(raw) == (UUID, 99)
    legacy_mig = "MIG-GPU-2a7d3c1e-5b8f-4a6d-9e0c-1f2b3c4d5e6f/14/127"
    assert len(device_id(legacy_mig, 99)) <= MAX_DEVICE_ID_LEN


@pytest.mark.parametrize("raw", ["GPU-1", "GPU-1::", "::3", "GPU-1::x"])
def test_parse_rejects_malformed_ids(raw: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_device_id(raw)


def test_too_long_uuid_is_rejected() -> None:
    with pytest.raises(InvalidArgument, match="longer than 63"):
        device_id("G" * 62, 1)


def test_node_slots_lists_every_card_times_slots() -> None:
    assert node_slots(node(2), 3) == (
        "GPU-0::0",
        "GPU-0::1",
        "GPU-0::2",
        "GPU-1::0",
        "GPU-1::1",
        "GPU-1::2",
    )


def test_assign_takes_the_lowest_free_slot_per_card() -> None:
    ledger = NodeLedger(node())
    first = assign_device_ids(ledger, alloc("a", Grant("c", (share(0), share(1)))), 4)
    assert first.grants[0].device_ids == ("GPU-0::0", "GPU-1::0")
    ledger = reserve(ledger, first)
    second = assign_device_ids(ledger, alloc("b", Grant("c", (share(1),))), 4)
    assert second.grants[0].device_ids == ("GPU-1::1",)
    assert free_slots(reserve(ledger, second), CardUuid("GPU-1"), 4) == ("GPU-1::2", "GPU-1::3")


def test_containers_of_one_pod_get_distinct_slots() -> None:
    ledger = NodeLedger(node())
    got = assign_device_ids(ledger, alloc("a", Grant("x", (share(0),)), Grant("y", (share(0),))), 4)
    assert [g.device_ids for g in got.grants] == [("GPU-0::0",), ("GPU-0::1",)]


def test_init_container_reuses_its_pods_app_ids_on_the_same_card() -> None:
    ledger = NodeLedger(node())
    got = assign_device_ids(
        ledger,
        alloc("a", Grant("init", (share(0), share(1)), init=True), Grant("app", (share(0),))),
        4,
    )
    assert got.grants[1].device_ids == ("GPU-0::0",)
    assert got.grants[0].device_ids == ("GPU-0::0", "GPU-1::0")


def test_a_card_with_every_slot_taken_is_exhausted() -> None:
    ledger = NodeLedger(node())
    for i in range(2):
        ledger = reserve(
            ledger, assign_device_ids(ledger, alloc(f"a{i}", Grant("c", (share(0),))), 2)
        )
    with pytest.raises(Exhausted, match="all 2 slots taken"):
        assign_device_ids(ledger, alloc("late", Grant("c", (share(0),))), 2)


def test_given_ids_must_match_the_grants_cards() -> None:
    bad = alloc("a", Grant("c", (share(0),), device_ids=("GPU-1::0",)))
    with pytest.raises(InvalidArgument, match="same cards"):
        assign_device_ids(NodeLedger(node()), bad, 4)


def test_device_ids_survive_the_codec_and_are_omitted_when_empty() -> None:
    with_ids = alloc("a", Grant("c", (share(0),), device_ids=("GPU-0::3",)))
    raw = codec.allocation_to(with_ids)
    assert raw["grants"][0]["device_ids"] == ["GPU-0::3"]
    assert codec.allocation_from(codec.Reader(raw)) == with_ids
    assert "device_ids" not in codec.allocation_to(alloc("b", Grant("c", (share(0),))))["grants"][0]
    assert card_of("GPU-0::3") == "GPU-0"
