"""A card in MIG mode as ``gpuledger inspect`` and ``kubectl gpuledger`` show it: MIG, its
instances by placement (static or made on demand), who holds each, a fault, and placements held
but not made yet; in a namespace's view only the namespace's; and a card not in MIG mode as before."""

from __future__ import annotations

import json
from dataclasses import replace

from gpuledger_cli import kubectl_view as view
from gpuledger_common import render
from gpuledger_common.mig_listing import placements
from gpuledger_core import codec_status
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.model import (
    Allocation,
    AllocState,
    Card,
    CardMode,
    CardShare,
    Grant,
    MigInstance,
    MigSlot,
    Owner,
    OwnerKind,
    Remedy,
)
from gpuledger_core.status import CardStatus, Holder, NodeStatus

A100 = "NVIDIA A100-SXM4-40GB"
STATIC, ON_DEMAND, UNMADE = MigSlot("3g.20gb", 4, 4), MigSlot("1g.10gb", 0, 1), MigSlot("2g.20gb", 2, 2)


def holder(ns: str, name: str, slot: MigSlot | None, mib: int = 20096, core: int = 428) -> Holder:
    owner = Owner(OwnerKind.POD, f"uid-{name}", ns, name)
    return Holder(AllocationId(f"a-{name}"), owner, "app", mib, core, False, AllocState.BOUND, 0.0, mig=slot)


def mig_card(*holders: Holder) -> CardStatus:
    instances = (
        MigInstance(STATIC, static=True, uuid="MIG-s"),
        MigInstance(ON_DEMAND, static=False, uuid="MIG-d", fault="XID 94 in the instance", remedy=Remedy.DRAIN),
    )
    card = Card(CardUuid("GPU-mig"), 0, A100, 40960, mode=CardMode.MIG, instances=instances)
    return CardStatus(card, 0, 0, holders)


TRAIN, ETL = holder("team-a", "train", STATIC), holder("team-b", "etl", UNMADE, 9856, 285)
NODE = NodeStatus(NodeName("a100-0"), (mig_card(TRAIN, ETL),))


def test_a_mig_cards_line_says_mig_and_each_placement_by_start() -> None:
    [header, line, summary] = render.cluster([NODE]).splitlines()
    assert line[header.index("HOLDERS") :] == (
        "MIG 1g.10gb@0 on demand: free, fault XID 94 in the instance [drain]; "
        f"2g.20gb@2 to be made: {render.holder(ETL)}; 3g.20gb@4 static: {render.holder(TRAIN)}"
    )
    assert render.holder(ETL).startswith("team-b/etl[app] (9856 MiB, 28.5%, bound, ")
    assert summary == "1 node(s), 1 card(s), 1 in use"


def test_the_placements_pair_each_instance_with_its_holder() -> None:
    found = [(p.slot, p.made, p.holder.owner.name if p.holder else None) for p in placements(NODE.cards[0])]
    assert found == [(ON_DEMAND, "on demand", None), (UNMADE, "to be made", "etl"), (STATIC, "static", "train")]


def test_an_empty_mig_card_says_so() -> None:
    empty = replace(NODE.cards[0], card=replace(NODE.cards[0].card, instances=()), holders=())
    assert render.cards([replace(NODE, cards=(empty,))]).splitlines()[1].endswith("MIG (no instances)")


def test_a_namespace_sees_only_its_placements_and_the_others_counted() -> None:
    lines = view.inspect_text([NODE], view.Scope("team-a")).splitlines()
    assert "MIG 3g.20gb@4 static: team-a/train[app]" in lines[1]
    assert lines[1].endswith("; +1 in other namespaces")
    assert "1g.10gb@0" not in lines[1] and "etl" not in lines[1]  # free or another's: not the namespace's to see


def test_a_whole_card_is_drawn_as_before() -> None:
    card = CardStatus(Card(CardUuid("GPU-1"), 1, "Tesla P4", 16384), 12288, 750, (replace(TRAIN, mig=None),))
    row = render.cards([NodeStatus(NodeName("p4-0"), (card,))]).splitlines()[1]
    assert row.split("  ")[-1].startswith("team-a/train[app] (20096 MiB, 42.8%, bound, ")
    assert "MIG" not in row


def test_top_marks_the_placement_granted() -> None:
    rows = view.top_rows([NODE], view.Scope())
    assert [(r.holder, r.mig) for r in rows] == [("train", "3g.20gb@4"), ("etl", "2g.20gb@2")]  # by namespace
    assert "9856 MiB (MIG 2g.20gb@2)" in view.top_text(rows, view.Scope())
    granted = [h["granted"] for h in view.top_json(rows, view.Scope())["holders"]]
    assert granted[1] == {"mem_mib": 9856, "core_milli": 285, "whole": False, "mig": "2g.20gb@2"}
    shared = replace(NODE, cards=(replace(NODE.cards[0], holders=(replace(TRAIN, mig=None),)),))
    whole = view.top_rows([shared], view.Scope())
    assert "mig" not in view.top_json(whole, view.Scope())["holders"][0]["granted"]


def test_the_json_and_the_nats_listing_give_each_holder_its_placement() -> None:
    listed = view.inspect_json([NODE], view.Scope())
    [card] = listed["nodes"][0]["cards"]
    assert card["mode"] == "mig" and [i["profile"] for i in card["instances"]] == ["3g.20gb", "1g.10gb"]
    assert [h.get("mig") for h in card["holders"]] == [
        {"profile": "3g.20gb", "start": 4, "size": 4},
        {"profile": "2g.20gb", "start": 2, "size": 2},
    ]
    unplaced = replace(NODE, cards=(replace(NODE.cards[0], holders=(replace(TRAIN, mig=None),)),))
    assert "mig" not in codec_status.node_status_to(unplaced)["cards"][0]["holders"][0]  # a share's holder: as before
    assert codec_status.node_status_from(json.loads(json.dumps(codec_status.node_status_to(NODE)))) == NODE


def test_an_allocation_of_a_placement_names_it() -> None:
    share = CardShare(CardUuid("GPU-mig"), 0, 9856, 142, False, ON_DEMAND)
    owner = Owner(OwnerKind.TOOL, "t1")
    grants = (Grant("", (share, CardShare(CardUuid("GPU-1"), 1, 4096, 250))),)
    text = render.allocation(Allocation(AllocationId("a1"), owner, NodeName("n"), grants, AllocState.BOUND))
    assert text.endswith("card 0 (MIG 1g.10gb@0: 9856 MiB, 14.2%), card 1 (4096 MiB, 25%)")
