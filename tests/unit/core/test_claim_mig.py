"""DRA mode C and the claims controller with MIG: a request of the MIG class as a classic
``Request(mig=...)`` (claim_asks_mig), refused by name where the ledger would not honour it; a
placement's device read back to the ledger's share (claims) and written from it (claim_status);
the shipped DeviceClasses as mode C reads them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger_core import claims
from gpuledger_core.claim_asks import RequestAsk, claim_ask, class_problem
from gpuledger_core.claim_asks_mig import is_mig_class
from gpuledger_core.claim_placement import place_claim
from gpuledger_core.claim_status import allocation_status
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import Exhausted, InvalidArgument
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.mig import share_of
from gpuledger_core.mig_profiles import A100_40GB
from gpuledger_core.model import (
    MIG_SMALLEST,
    Allocation,
    AllocState,
    CardMode,
    Grant,
    MigSlot,
    Node,
    Owner,
    OwnerKind,
    Request,
)
from gpuledger_core.packing import make_policy
from tests.unit.core.builders import NODE, card

DRIVER = "gpu.gpuledger.io"
MIG_CLASS = "mig.gpu.gpuledger.io"
SHIPPED = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / "dra" / "deviceclass.yaml"
CLASSES: dict[str, Any] = {c["metadata"]["name"]: c for c in yaml.safe_load_all(SHIPPED.read_text())}
REF = ClaimRef("ns", "c", "uid-1")
A100 = "NVIDIA A100-SXM4-40GB"


def profile_is(profile: str, quote: str = '"') -> dict[str, Any]:
    return {"cel": {"expression": f"device.attributes[{quote}{DRIVER}{quote}].profile  ==  {quote}{profile}{quote}"}}


def claim(*requests: dict[str, Any], constraints: list[Any] | None = None) -> Any:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints is not None:
        devices["constraints"] = constraints
    return {"metadata": {"namespace": "ns", "name": "c", "uid": "uid-1"}, "spec": {"devices": devices}}


def mig(name: str = "gpu", **more: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": MIG_CLASS, **more}}


def asked(*requests: dict[str, Any]) -> tuple[RequestAsk, ...]:
    found = claim_ask(claim(*requests), CLASSES, DRIVER)
    assert found is not None
    return found.requests


def test_the_shipped_classes_are_mode_cs_and_only_the_mig_class_selects_placements() -> None:
    assert set(CLASSES) == {"gpu.gpuledger.io", "mps.gpu.gpuledger.io", MIG_CLASS}
    assert all(class_problem(c, DRIVER) == "" for c in CLASSES.values())
    assert [n for n, c in CLASSES.items() if is_mig_class(c, DRIVER)] == [MIG_CLASS]


def test_a_profile_by_selector_or_the_smallest_holding_memory_and_compute() -> None:
    found = asked(
        mig("named", selectors=[profile_is("1g.10gb")], count=2),
        mig("quoted", selectors=[profile_is("3g.20gb", "'")]),
        mig("sized", capacity={"requests": {"memory": "9000Mi", "compute": "20"}}),
        mig("memory", capacity={"requests": {"memory": "10Gi"}}),
    )
    assert found == (
        RequestAsk("named", (("named", Request(2, mig="1g.10gb")),)),
        RequestAsk("quoted", (("quoted", Request(1, mig="3g.20gb")),)),
        RequestAsk("sized", (("sized", Request(1, 9000, 200, mig=MIG_SMALLEST)),)),
        RequestAsk("memory", (("memory", Request(1, 10240, mig=MIG_SMALLEST)),)),  # no grid: exactly 10 GiB
    )


def test_first_available_may_fall_back_from_a_profile_to_a_card() -> None:
    request = {"name": "gpu", "firstAvailable": [
        {"name": "small", "deviceClassName": MIG_CLASS, "selectors": [profile_is("1g.5gb")]},
        {"name": "card", "deviceClassName": "gpu.gpuledger.io"},
    ]}  # fmt: skip
    assert asked(request) == (RequestAsk("gpu", (("gpu/small", Request(1, mig="1g.5gb")), ("gpu/card", Request(1)))),)


@pytest.mark.parametrize(
    ("request_", "field", "why"),
    [
        (mig(selectors=[profile_is("1g.10gb"), profile_is("1g.5gb")]), "selectors", "one selector"),
        (mig(selectors=[{"cel": {"expression": f'device.attributes["{DRIVER}"].model == "x"'}}]), "selectors",
         "one selector of a MIG request"),
        (mig(selectors=[profile_is("9g.90gb")]), "selectors", "no card model offers the MIG profile 9g.90gb"),
        (mig(selectors=[profile_is("1g.10gb")], capacity={"requests": {"memory": "1Gi"}}), "capacity",
         "names its memory and compute"),
        (mig(), "selectors", "names a profile"),
        (mig(capacity={"requests": {"slots": "1"}}), "capacity", "not slots"),
        (mig(capacity={"requests": {"compute": "101"}}), "compute", "1..100 percent"),
        (mig(selectors=[profile_is("1g.10gb")], tolerations=[{"operator": "Exists"}]), "tolerations",
         "left to kube-scheduler"),
        ({"name": "gpu", "exactly": {"deviceClassName": DRIVER, "selectors": [profile_is("1g.10gb")]}},
         "selectors", "CEL selectors in a claim"),
    ],
)  # fmt: skip
def test_what_the_ledger_would_not_honour_is_refused_naming_it(request_: dict[str, Any], field: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        claim_ask(claim(request_), CLASSES, DRIVER)
    assert field in caught.value.field and why in str(caught.value)


def test_a_mig_request_in_an_nvlink_constraint_is_refused() -> None:
    constraint = {"requests": ["gpu"], "matchAttribute": f"{DRIVER}/nvlinkGroup2"}
    with pytest.raises(InvalidArgument, match="MIG request gpu in an NVLink constraint"):
        claim_ask(claim(mig(selectors=[profile_is("1g.10gb")], count=2), constraints=[constraint]), CLASSES, DRIVER)


def mig_node() -> Node:
    cards = (card(0, 40960, model=A100), replace(card(1, 40960, model=A100), mode=CardMode.MIG))
    return Node(NODE, cards)


def mig_allocation(node: Node) -> Allocation:
    profile = A100_40GB.by_name("3g.20gb")
    assert profile is not None
    shares = (share_of(node.cards[1], profile, 4),)
    return Allocation(AllocationId("c-planned"), REF.owner, NODE, (Grant("gpu", shares),), AllocState.BOUND,
                      requests=(Request(1, mig="3g.20gb"),))  # fmt: skip


def test_a_placement_is_written_as_its_device_without_a_share_and_read_back_to_the_same_entry() -> None:
    node = mig_node()
    planned = mig_allocation(node)
    status = allocation_status(planned, node, DRIVER, 0.0, shareable=True, share_id=lambda: "never")
    (result,) = status["devices"]["results"]
    assert result == {"request": "gpu", "driver": DRIVER, "pool": str(NODE), "device": "gpu-1-mig-3g-20gb-4"}
    raw = {"metadata": {"namespace": "ns", "name": "c", "uid": "uid-1"}, "status": {"allocation": status}}
    devices = claims.results_of(raw, DRIVER)
    back = claims.ledger_allocation(REF, devices, node, now=0.0)
    (share,) = back.shares()
    assert share.mig == MigSlot("3g.20gb", 4, 4) and (share.index, share.uuid) == (1, node.cards[1].uuid)
    assert (share.mem_mib, share.core_milli, share.exclusive) == (19968, 428, False)
    assert back.requests == (Request(1, mig="3g.20gb"),)
    assert back.id == claims.allocation_id(REF, devices)


@pytest.mark.parametrize(
    ("device", "why"),
    [("gpu-1-mig-3g-20gb-2", "has no MIG placement 3g-20gb at 2"), ("gpu-7-mig-1g-5gb-0", "no card of node")],
)
def test_a_result_that_is_no_placement_of_the_nodes_cards_is_refused(device: str, why: str) -> None:
    raw = {"metadata": {"namespace": "ns", "name": "c", "uid": "uid-1"}, "status": {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": DRIVER, "pool": str(NODE), "device": device}]}}}}  # fmt: skip
    with pytest.raises(InvalidArgument, match=why):
        claims.ledger_allocation(REF, claims.results_of(raw, DRIVER), mig_node(), now=0.0)


def mig_ledger(name: str, *held: tuple[str, int]) -> NodeLedger:
    """A node of one A100 in MIG mode, ``held``: placements a pod holds on it."""
    node = Node(NodeName(name), (replace(card(0, 40960, model=A100), mode=CardMode.MIG),))
    ledger = NodeLedger(node)
    for profile_name, start in held:
        profile = A100_40GB.by_name(profile_name)
        assert profile is not None
        owner = Owner(OwnerKind.POD, f"pod-{name}-{start}", "ns", "p")
        grant = Grant("main", (share_of(node.cards[0], profile, start),))
        ledger = reserve(ledger, Allocation(AllocationId(f"a-{name}-{start}"), owner, node.name, (grant,),
                                            AllocState.BOUND, requests=(Request(1, mig=profile_name),)))  # fmt: skip
    return ledger


def test_mode_c_places_a_mig_claim_where_it_keeps_most_and_the_ledger_takes_what_is_written() -> None:
    """Node a is empty, node b has half its card held: a 3g.20gb takes b's other half (the
    chooser keeps a's card whole for what comes), not the first node by name; a node without MIG
    says why it was passed over."""
    plain = NodeLedger(Node(NodeName("0-plain"), (card(0, 40960, model=A100),)))
    a, b = mig_ledger("a"), mig_ledger("b", ("4g.20gb", 0))
    ask = claim_ask(claim(mig("gpu", selectors=[profile_is("3g.20gb")])), CLASSES, DRIVER)
    assert ask is not None
    found = place_claim([plain, a, b], ask, make_policy("default"), AllocationId("c-planned"), 0.0, slots_per_card=8)
    (share,) = found.allocation.shares()
    assert found.allocation.node == "b" and share.mig == MigSlot("3g.20gb", 4, 4)
    status = allocation_status(found.allocation, b.node, DRIVER, 0.0, shareable=True)
    assert [r["device"] for r in status["devices"]["results"]] == ["gpu-0-mig-3g-20gb-4"]
    raw = {"metadata": {"namespace": "ns", "name": "c", "uid": "uid-1"}, "status": {"allocation": status}}
    written = claims.ledger_allocation(REF, claims.results_of(raw, DRIVER), b.node, now=0.0)
    taken = reserve(b, written)  # the ledger's own MIG rules take it
    with pytest.raises(Exhausted, match="no node"):
        place_claim([plain, taken], ask, make_policy("default"), AllocationId("c-2"), 0.0, slots_per_card=8)
    with pytest.raises(Exhausted) as caught:
        place_claim([plain], ask, make_policy("default"), AllocationId("c-3"), 0.0, slots_per_card=8)
    assert "0-plain" in str(caught.value)
