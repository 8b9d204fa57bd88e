from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings

from gpuledger_core import codec, codec_status
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.events import LedgerEvent
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Card, Drain, Health, Node, Owner, OwnerKind, Remedy
from gpuledger_core.status import NodeStatus

from . import strategies as s
from .builders import holding, ledger, share


def _wire(value: dict[str, Any]) -> object:
    """Through JSON text, as the ledger store and NATS carry it."""
    decoded: object = json.loads(json.dumps(value))
    return decoded


@settings(max_examples=100, deadline=None)
@given(s.ledgers)
def test_ledger_round_trip(value: NodeLedger) -> None:
    assert codec.ledger_from(_wire(codec.ledger_to(value))) == value


@settings(max_examples=100, deadline=None)
@given(s.events)
def test_event_round_trip(value: LedgerEvent) -> None:
    assert codec.event_from(_wire(codec.event_to(value))) == value


@settings(max_examples=100, deadline=None)
@given(s.node_statuses)
def test_node_status_round_trip(value: NodeStatus) -> None:
    assert codec_status.node_status_from(_wire(codec_status.node_status_to(value))) == value


@settings(max_examples=50, deadline=None)
@given(s.nodes)
def test_node_round_trip(value: Node) -> None:
    assert codec.node_from(codec.Reader(_wire(codec.node_to(value)))) == value


@settings(max_examples=50, deadline=None)
@given(s.allocations)
def test_allocation_round_trip(value: Allocation) -> None:
    assert codec.allocation_from(codec.Reader(_wire(codec.allocation_to(value)))) == value


def _stored() -> dict[str, Any]:
    state = ledger(8000, 8000)
    state = NodeLedger(state.node, (holding("a", share(0, 100, 10)),))
    raw = codec.ledger_to(state)
    raw["allocations"][0]["requests"] = [{"count": 1, "mem_mib": 100}]
    return raw


Edit = Callable[[dict[str, Any]], None]


def _set(path: str, value: object) -> Edit:
    """An edit that sets (or, with ``...``, deletes) the value at a dotted path like ``a.0.b``."""

    def edit(raw: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = raw
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        key: Any = int(last) if last.isdigit() else last
        if value is ...:
            del target[key]
        else:
            target[key] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "field", "problem"),
    [
        (_set("allocations.0.owner", "pod"), "allocations[0].owner", "has the wrong type str"),
        (
            _set("allocations.0.state", "lost"),
            "allocations[0].state",
            "must be one of reserved|bound|released, got 'lost'",
        ),
        (_set("allocations.0.id", 7), "allocations[0].id", "has the wrong type int"),
        (_set("allocations.0.created_at", True), "allocations[0].created_at", "must be a number, got True"),
        (_set("allocations.0.lease_expires_at", "soon"), "allocations[0].lease_expires_at", "has the wrong type str"),
        (
            _set("allocations.0.grants.0.cards.0.mem_mib", "1G"),
            "allocations[0].grants[0].cards[0].mem_mib",
            "has the wrong type str",
        ),
        (
            _set("allocations.0.grants.0.cards.0.exclusive", "yes"),
            "allocations[0].grants[0].cards[0].exclusive",
            "has the wrong type str",
        ),
        (_set("allocations.0.grants.0.cards", {}), "allocations[0].grants[0].cards", "has the wrong type dict"),
        (_set("allocations.0.requests.0.count", 0), "allocations[0].requests[0].gpu", "must be 1..64 cards, got 0"),
        (
            _set("allocations.0.requests.0.mem_mib", -1),
            "allocations[0].requests[0].gpu-mem",
            "must be a positive number of MiB, got -1",
        ),
        (_set("allocations.1", []), "allocations[1]", "must be an object, got list"),
        (_set("node.cards.1.memory_mib", True), "node.cards[1].memory_mib", "must be a number, got True"),
        (_set("node.cards.1.health", "meh"), "node.cards[1].health", "must be one of healthy|unhealthy, got 'meh'"),
        (_set("node.cards.0.uuid", ...), "node.cards[0].uuid", "is required"),
        (
            _set("node.links", [{"a": 0, "b": 1, "pcie": 7}]),
            "node.links[0].pcie",
            "must be one of 0|10|20|30|40|50, got 7",
        ),
        (_set("node.labels", ["a"]), "node.labels", "has the wrong type list"),
        (_set("node", None), "node", "is required"),
    ],
)
def test_a_decoding_error_names_the_field_path(edit: Edit, field: str, problem: str) -> None:
    raw = _stored()
    raw["allocations"].append(copy.deepcopy(raw["allocations"][0]))
    raw["allocations"][1]["id"] = "b"
    edit(raw)
    with pytest.raises(InvalidArgument) as caught:
        codec.ledger_from(raw)
    assert (caught.value.field, caught.value.problem) == (field, problem)


@pytest.mark.parametrize(
    ("decode", "raw", "field"),
    [
        (codec.ledger_from, [], "body"),
        (codec.event_from, {"kind": "nope", "node": "n"}, "kind"),
        (codec.event_from, {"kind": "bound", "node": "n", "allocation": {"id": "a"}}, "allocation.owner"),
        (
            codec_status.node_status_from,
            {"name": "n", "cards": [{"uuid": "u", "index": 0, "model": "m", "memory_mib": 1}]},
            "cards[0].free_mem_mib",
        ),
    ],
)
def test_other_documents_name_their_fields_too(decode: Callable[[object], object], raw: object, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode(raw)
    assert caught.value.field == field


def test_optional_fields_take_their_defaults() -> None:
    raw = {
        "node": {"name": "node-a", "cards": [{"uuid": "GPU-0000", "index": 0, "model": "m", "memory_mib": 10}]},
        "allocations": [
            {
                "id": "a",
                "owner": {"kind": "pod", "id": "uid-a"},
                "node": "node-a",
                "state": "reserved",
                "grants": [{"cards": [{"uuid": "GPU-0000", "index": 0, "mem_mib": 1, "core_milli": 0}]}],
            }
        ],
    }
    decoded = codec.ledger_from(raw)
    (only,) = decoded.allocations
    assert only.lease_expires_at is None
    assert only.grants[0].container == ""
    assert not only.grants[0].cards[0].exclusive
    assert decoded.node.cards[0].pci_bus_id == ""
    assert decoded.node.cards[0].numa is None
    assert decoded.node.cards[0].remedy is Remedy.NONE  # a value written before remediation


def test_a_card_s_remedy_is_written_only_while_it_has_one() -> None:
    card = Card(CardUuid("GPU-0"), 0, "m", 10)
    assert "remedy" not in codec.card_to(card)
    drained = replace(card, health=Health.UNHEALTHY, remedy=Remedy.DRAIN)
    assert codec.card_to(drained)["remedy"] == "drain"
    assert codec.card_from(codec.Reader(codec.card_to(drained))) == drained
    with pytest.raises(InvalidArgument, match="remedy"):
        codec.card_from(codec.Reader({**codec.card_to(card), "remedy": "mend"}))


def test_an_allocation_s_drain_is_written_only_while_it_has_one() -> None:
    allocation = Allocation(AllocationId("a"), Owner(OwnerKind.TOOL, "ci"), NodeName("n"), ())
    assert "drain" not in codec.allocation_to(allocation)
    drained = replace(allocation, drain=Drain(CardUuid("GPU-0"), 0, 10.0, 310.0, "card 0 (GPU-0) ...: XID 79"))
    assert codec.allocation_to(drained)["drain"]["release_at"] == 310.0
    assert codec.allocation_from(codec.Reader(_wire(codec.allocation_to(drained)))) == drained
    with pytest.raises(InvalidArgument, match=r"drain\.since"):
        bad = {"card": "GPU-0", "card_index": 0, "since": "x"}
        codec.allocation_from(codec.Reader({**codec.allocation_to(drained), "drain": bad}))


def _node_raw(name: str, links: list[dict[str, Any]]) -> dict[str, Any]:
    cards = [{"uuid": f"GPU-{name}-{i}", "index": i, "model": "m", "memory_mib": 10} for i in range(2)]
    return {"name": name, "cards": cards, "links": links}


def test_nodes_listing_the_same_links_share_them() -> None:
    links = [{"a": 0, "b": 1, "nvlinks": 12, "pcie": 10}]
    first = codec.node_from(codec.Reader(_wire(_node_raw("n1", links))))
    second = codec.node_from(codec.Reader(_wire(_node_raw("n2", links))))
    assert second.links is first.links  # decoded once, shared (their topology is made once too)
    other = codec.node_from(codec.Reader(_wire(_node_raw("n3", [{**links[0], "nvlinks": 4}]))))
    assert other.links[0].nvlinks == 4


@pytest.mark.parametrize(
    ("value", "problem"), [(1.0, "has the wrong type float"), (True, "must be a number, got True")]
)
def test_links_equal_to_decoded_ones_in_value_but_not_type_are_still_refused(value: object, problem: str) -> None:
    codec.node_from(codec.Reader(_wire(_node_raw("n1", [{"a": 0, "b": 1, "nvlinks": 1}]))))
    with pytest.raises(InvalidArgument) as caught:
        codec.node_from(codec.Reader(_node_raw("n2", [{"a": 0, "b": 1, "nvlinks": value}])))
    assert (caught.value.field, caught.value.problem) == ("links[0].nvlinks", problem)
