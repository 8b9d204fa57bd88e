"""The dashboard's aggregates: a node's row from its status, the cluster's totals and models, and
pages of the rows a filter matches, each row remade only when its node changed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger_allocator.overview import Filter, NodeRow, Overview, node_row, summary, totals
from gpuledger_core.card_usage import ProcessUse, Usage
from gpuledger_core.fragmentation import Fragmentation
from gpuledger_core.ids import NodeName
from gpuledger_core.model import Remedy
from gpuledger_core.status import node_status
from tests.support.big_fleet import PROFILES, fill, node_ledger, offline_view


def test_a_node_row_counts_its_cards_holders_states_and_use() -> None:
    ledger = node_ledger(25, holders=3)  # an A100 node: three pods, its last card draining
    status = node_status(ledger)
    uuid = ledger.node.cards[0].uuid
    row = node_row(status, Fragmentation(250.0, 4000), {uuid: Usage(2, 9000)})
    assert (row.name, row.models, row.cards) == ("a100-00025", ("NVIDIA A100-SXM4-80GB",), 8)
    assert dict(row.states) == {"healthy": 7, "draining": 1}
    granted = sum(c.card.memory_mib - c.free_mem_mib for c in status.cards)
    assert (row.granted_mib, row.used_mib, row.holders) == (granted, 9000, 3)
    assert row.namespaces == {"research", "serving", "batch"}
    assert row.has_state("draining") and not row.has_state("healthy") and not row.has_state("over-grant")
    assert node_row(status, Fragmentation(), None).used_mib is None  # no usage report: not measured
    assert row.used_core_milli is None  # a report of no process's SM time: not sampled
    sampled = Usage(2, 9000, (ProcessUse(5000, "p", sm_percent=70), ProcessUse(4000, None, sm_percent=45)))
    assert node_row(status, Fragmentation(), {uuid: sampled}).used_core_milli == 1000  # at most the card


@pytest.mark.parametrize(
    ("where", "shown"),
    [
        (Filter(), True),
        (Filter(text="gpu-0"), True),
        (Filter(text="gpu-1"), False),
        (Filter(model="T4"), True),
        (Filter(model="T"), False),  # a model is matched whole
        (Filter(namespace="ml"), True),
        (Filter(namespace="web"), False),
        (Filter(state="retired"), True),
        (Filter(state="healthy"), False),
        (Filter(state="over-grant"), True),
        (Filter(state="stale"), False),
        (Filter(text="gpu", model="T4", namespace="ml", state="retired"), True),
    ],
)
def test_a_filter_matches_name_model_namespace_and_state(where: Filter, shown: bool) -> None:
    row = NodeRow("gpu-0", ("T4",), cards=2, states={"healthy": 1, "retired": 1}, namespaces=frozenset({"ml"}), over=1)
    assert where.matches(row) is shown


def test_totals_add_the_rows_up_and_used_only_where_reported() -> None:
    a = NodeRow("a", ("X",), 2, {"healthy": 2}, 100, 40, None, 2000, 500, 1, 0, frozenset({"n1"}), Fragmentation(5, 50))
    b = NodeRow("b", ("Y",), 1, {"retired": 1}, 10, 4, 3, 1000, 0, 2, 1, frozenset({"n2"}), Fragmentation(1, 10), True)
    whole = totals([a, b])
    assert (whole.cards, whole.memory_mib, whole.granted_mib, whole.used_mib) == (3, 110, 44, 3)
    assert (whole.core_milli, whole.granted_core_milli, whole.holders, whole.over) == (3000, 500, 3, 1)
    assert (whole.models, whole.namespaces, whole.stale) == (("X", "Y"), frozenset({"n1", "n2"}), True)
    assert whole.frag == Fragmentation(6, 60) and dict(whole.states) == {"healthy": 2, "retired": 1}
    assert totals([a]).used_mib is None
    assert totals([a, replace(b, used_core_milli=300)]).used_core_milli == 300 and whole.used_core_milli is None


def test_a_summary_pages_the_matching_rows_by_name() -> None:
    overview = Overview(fill(offline_view(), 120))
    first = summary(overview, Filter(), page=0, size=50)
    assert (first["matched"], len(first["nodes"]), first["totals"]["nodes"]) == (120, 50, 120)
    names = [n["name"] for page in range(3) for n in summary(overview, Filter(), page, 50)["nodes"]]
    assert names == sorted(names) and len(set(names)) == 120
    assert summary(overview, Filter(), page=3, size=50)["nodes"] == []
    retired = summary(overview, Filter(state="retired"), size=500)
    assert [n["name"] for n in retired["nodes"]] == ["h100-00000", "h100-00100", "rtx3090-00050"]
    models = {m["model"]: m for m in first["models"]}
    assert {m["nodes"] for m in models.values()} == {120 // len(PROFILES)}
    assert sum(m["cards"] for m in models.values()) == first["totals"]["cards"]
    assert sum(m["not_healthy"] for m in models.values()) == 5  # nodes 0, 25, 50, 75, 100


def test_a_row_is_remade_only_when_its_node_changes() -> None:
    view = fill(offline_view(), 4)
    overview = Overview(view)
    name = NodeName("h100-00000")
    before = overview.row(name)
    assert before is not None and overview.row(name) is before
    ledger = view.ledgers[name]
    last = replace(ledger.node.cards[-1], remedy=Remedy.NONE)
    view.apply(name, replace(ledger, node=replace(ledger.node, cards=(*ledger.node.cards[:-1], last))), 99)
    after = overview.row(name)
    assert after is not None and after is not before
    assert dict(before.states) == {"healthy": 7, "retired": 1} and dict(after.states) == {"unhealthy": 1, "healthy": 7}
    view.apply(name, None, 100)
    assert overview.row(name) is None and [r.name for r in overview.rows()] == sorted(view.ledgers)
