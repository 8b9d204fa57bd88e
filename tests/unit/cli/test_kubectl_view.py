"""What ``kubectl gpuledger`` shows of a cluster's status: a namespace's cards (the others' holders
counted, not named), every card with -A, and ``top``: granted against used, with what is not
measured said so."""

from __future__ import annotations

import json
from dataclasses import replace

from gpuledger_cli import kubectl_view as view
from gpuledger_common import render
from gpuledger_core import codec_status
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.model import AllocState, Card, Owner, OwnerKind
from gpuledger_core.status import CardStatus, Holder, NodeStatus

A, B = view.Scope("team-a"), view.Scope("team-b")
ALL = view.Scope()


def holder(ns: str, name: str, mib: int = 0, core: int = 0, kind: OwnerKind = OwnerKind.POD) -> Holder:
    owner = Owner(kind, f"uid-{name}", ns, name)
    exclusive = not mib
    return Holder(
        AllocationId(f"a-{name}"), owner, "app" if kind is OwnerKind.POD else "", mib or 16384,
        core or 1000, exclusive, AllocState.BOUND, 0.0,
    )  # fmt: skip


def card(index: int, *holders: Holder, processes: int = 0, foreign: tuple[int, int] = (0, 0)) -> CardStatus:
    c = Card(CardUuid(f"GPU-{index}"), index, "Tesla P4", 16384)
    mem = 0 if any(h.exclusive for h in holders) else 16384 - sum(h.mem_mib for h in holders)
    core = 0 if any(h.exclusive for h in holders) else 1000 - sum(h.core_milli for h in holders)
    return CardStatus(c, mem, core, holders, processes, *foreign)


TOOL = holder("", "batch", 2048, 100, OwnerKind.TOOL)
NODES = [
    NodeStatus(
        NodeName("p4-0"),
        (
            card(0, holder("team-a", "train"), processes=1),  # whole card
            card(
                1,
                holder("team-a", "infer", 4096, 250),
                holder("team-b", "web", 2048, 100),
                processes=3,
                foreign=(1, 512),
            ),
        ),
    ),
    NodeStatus(
        NodeName("p4-1"), (card(0, holder("team-b", "etl", 1024, 100), TOOL), card(1, processes=2, foreign=(2, 700)))
    ),
]


def test_a_namespace_sees_the_cards_its_pods_hold_and_the_others_as_a_count() -> None:
    scoped = view.scoped(NODES, A)
    assert [(n.name, [c.card.index for c in n.cards]) for n in scoped.nodes] == [("p4-0", [0, 1])]
    shared = scoped.nodes[0].cards[1]
    assert [h.owner.name for h in shared.holders] == ["infer"]
    assert (shared.free_mem_mib, shared.free_core_milli) == (16384 - 4096 - 2048, 1000 - 250 - 100)  # over all holders
    assert scoped.others == {"GPU-1": 1}


def test_all_namespaces_is_the_whole_status() -> None:
    assert view.scoped(NODES, ALL).nodes == tuple(NODES)
    assert view.inspect_text(NODES, ALL) == render.cluster(NODES)


def test_the_namespace_table_is_inspects_with_a_summary_of_both() -> None:
    lines = view.inspect_text(NODES, A).splitlines()
    assert lines[0].split() == ["NODE", "CARD", "MODEL", "FREE", "MiB", "FREE", "CORE", "HEALTH", "FOREIGN", "HOLDERS"]
    assert "team-a/train[app] (whole card, bound" in lines[1]
    assert "team-a/infer[app] (4096 MiB, 25%, bound" in lines[2] and "+1 in other namespaces" in lines[2]
    assert "web" not in "\n".join(lines)
    assert lines[-1] == (
        "namespace team-a: 2 holder(s) on 2 card(s) of 1 node(s); "
        "all namespaces: 2 node(s), 4 card(s), 3 in use (-A shows them)"
    )


def test_a_namespace_without_cards_says_so() -> None:
    assert view.inspect_text(NODES, view.Scope("nobody")) == (
        "namespace nobody holds no cards; all namespaces: 2 node(s), 4 card(s), 3 in use (-A shows them)"
    )


def test_tools_have_no_namespace_and_show_only_with_all_namespaces() -> None:
    assert all(
        h.owner.kind is not OwnerKind.TOOL for n in view.scoped(NODES, B).nodes for c in n.cards for h in c.holders
    )
    assert "tool:uid-batch" in view.inspect_text(NODES, ALL)


def test_an_unreadable_node_is_shown_in_a_namespaces_view() -> None:
    bad = NodeStatus(NodeName("bad-0"), (), unreadable="ledger value: not valid JSON")
    assert "bad-0 (unreadable: ledger value: not valid JSON)" in view.inspect_text([*NODES, bad], A)


def test_json_is_inspects_shape_of_the_scope() -> None:
    found = view.inspect_json(NODES, A)
    assert found["namespace"] == "team-a"
    [node] = found["nodes"]
    assert [c["other_holders"] for c in node["cards"]] == [0, 1]
    assert [[h["owner"]["name"] for h in c["holders"]] for c in node["cards"]] == [["train"], ["infer"]]
    everything = view.inspect_json(NODES, ALL)
    assert everything == {"namespace": None, "nodes": [codec_status.node_status_to(n) for n in NODES]}
    json.dumps(everything)


def test_top_has_one_row_per_holder_and_card_granted_against_used() -> None:
    rows = view.top_rows(NODES, A)
    assert [(r.holder, r.node, r.card, r.granted_mib, r.granted_core_milli, r.whole) for r in rows] == [
        ("infer", "p4-0", 1, 4096, 250, False),
        ("train", "p4-0", 0, 16384, 1000, True),
    ]
    assert all(r.used == view.Use() and not r.over for r in rows)  # no attribution in this status
    assert [(r.card_processes, r.card_foreign_processes, r.card_foreign_mib) for r in rows] == [(3, 1, 512), (1, 0, 0)]


def test_top_with_all_namespaces_shows_tools_and_use_outside_the_ledger() -> None:
    rows = view.top_rows(NODES, ALL)
    assert [(r.namespace, r.holder) for r in rows] == [
        ("", "(outside the ledger)"),
        ("", "tool:uid-batch"),
        ("team-a", "infer"),
        ("team-a", "train"),
        ("team-b", "etl"),
        ("team-b", "web"),
    ]
    outside = rows[0]
    assert (outside.granted_mib, outside.used, outside.card_processes) == (None, view.Use(mem_mib=700), 2)


def test_top_text_says_what_is_not_measured() -> None:
    text = view.top_text(view.top_rows(NODES, A), A)
    header, infer, train = text.split("\n\n")[0].splitlines()
    assert header.split() == [
        "NAMESPACE", "HOLDER", "CONTAINER", "NODE", "CARD", "MEM", "GRANTED", "MEM", "USED",
        "CORE", "GRANTED", "CORE", "USED", "CARD", "PROCS", "FOREIGN",
    ]  # fmt: skip
    assert infer.split() == [
        "team-a", "infer", "app", "p4-0", "1", "4096", "MiB", "n/m", "25%", "n/m", "3", "1", "proc,", "512", "MiB",
    ]  # fmt: skip
    assert train.split() == [
        "team-a", "train", "app", "p4-0", "0", "16384", "MiB", "(whole)", "n/m", "100%", "(whole)", "n/m", "1", "-",
    ]  # fmt: skip
    assert text.endswith(view.NOT_MEASURED_NOTE)


def test_top_text_shows_use_where_it_is_measured() -> None:
    rows = [r for r in view.top_rows(NODES, ALL) if r.holder == view.OUTSIDE]
    text = view.top_text(rows, ALL)
    assert text.splitlines()[1].split()[:8] == ["-", "(outside", "the", "ledger)", "-", "p4-1", "1", "-"]
    assert "700 MiB" in text.splitlines()[1]


def test_top_of_a_namespace_without_cards() -> None:
    assert view.top_text(view.top_rows(NODES, view.Scope("nobody")), view.Scope("nobody")) == (
        "namespace nobody holds no cards"
    )


def test_top_json_keeps_a_place_for_what_is_not_measured() -> None:
    found = view.top_json(view.top_rows(NODES, A), A)
    assert found["namespace"] == "team-a"
    first = found["holders"][0]
    assert first["granted"] == {"mem_mib": 4096, "core_milli": 250, "whole": False}
    assert (first["used"], first["over"]) == ({"mem_mib": None, "core_milli": None}, False)
    assert (first["card_processes"], first["card_foreign"]) == (3, {"processes": 1, "mem_mib": 512})


def test_top_shows_what_the_share_audit_measured_and_marks_a_share_over_its_grant() -> None:
    measured = replace(holder("team-a", "infer", 4096, 250), used_mib=5000, over=True)
    within = replace(holder("team-a", "train", 4096, 250), used_mib=1200)
    nodes = [NodeStatus(NodeName("p4-0"), (card(1, measured, within, processes=2),))]
    rows = view.top_rows(nodes, A)
    assert [(r.holder, r.used, r.over) for r in rows] == [
        ("infer", view.Use(mem_mib=5000), True),
        ("train", view.Use(mem_mib=1200), False),
    ]
    infer, train = view.top_text(rows, A).splitlines()[1:3]
    assert "5000 MiB OVER GRANT" in infer and "1200 MiB" in train and "OVER" not in train
    assert view.top_json(rows, A)["holders"][0]["used"] == {"mem_mib": 5000, "core_milli": None}


def test_top_shows_a_pod_s_share_of_the_sm_time_where_nvml_samples_it() -> None:
    busy = replace(holder("team-a", "infer", 4096, 250), used_mib=1000, used_core_milli=450)
    nodes = [NodeStatus(NodeName("p4-0"), (card(1, busy, processes=1),))]
    rows = view.top_rows(nodes, A)
    assert [r.used for r in rows] == [view.Use(mem_mib=1000, core_milli=450)]
    assert "45%" in view.top_text(rows, A).splitlines()[1]
    assert view.top_json(rows, A)["holders"][0]["used"] == {"mem_mib": 1000, "core_milli": 450}
