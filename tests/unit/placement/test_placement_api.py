"""The entry points the services call: place, filter_nodes, score_nodes, from_ledger, shares."""

from __future__ import annotations

from random import Random

import pytest

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import (
    Allocation,
    Card,
    CardShare,
    Grant,
    Health,
    Link,
    Node,
    Owner,
    OwnerKind,
    PcieLevel,
)
from gpuledger_core.packing import (
    POLICIES,
    Ask,
    Decision,
    NoFit,
    TypicalPod,
    filter_nodes,
    flat_node,
    from_ledger,
    gpu_ask,
    make_policy,
    place,
    score_nodes,
    shares,
)
from gpuledger_core.packing.profiles import dgx1

pytestmark = pytest.mark.timeout(10)

TYPICAL = (
    [TypicalPod(4000, 1, 1000)] * 5 + [TypicalPod(2000, 1, 500)] * 3 + [TypicalPod(8000, 0, 0)]
)


def card(i: int, model: str = "A100", health: Health = Health.HEALTHY) -> Card:
    return Card(CardUuid(f"GPU-{i}"), i, model, 40960, numa=i // 2, health=health)


def ledger(*allocations: Allocation) -> NodeLedger:
    node = Node(
        NodeName("gpu-a"),
        tuple(card(i) for i in range(4)),
        (Link(0, 1, 4, PcieLevel.SINGLE_SWITCH), Link(2, 3, 4, PcieLevel.SINGLE_SWITCH)),
        64000,
        262144,
    )
    return NodeLedger(node, allocations)


def holding(index: int, core: int, mem: int) -> Allocation:
    share = CardShare(
        CardUuid(f"GPU-{index}"), index, mem, core, exclusive=core == 1000 and not mem
    )
    return Allocation(
        AllocationId(f"a{index}"),
        Owner(OwnerKind.TOOL, f"t{index}"),
        NodeName("gpu-a"),
        (Grant("", (share,)),),
    )


def test_from_ledger_reports_what_is_free() -> None:
    state = from_ledger(ledger(holding(0, 300, 10240)), cpu_free=1000)
    assert [c.core_free for c in state.cards] == [700, 1000, 1000, 1000]
    assert state.cards[0].mem_free == 30720
    assert not state.cards[0].idle
    assert state.topology is not None
    assert state.topology.nvlinks[0][1] == 4
    assert state.cpu_free == 1000
    assert state.cpu_total == 64000


def test_the_interconnect_is_worked_out_once_per_inventory() -> None:
    first = ledger()
    later = NodeLedger(first.node, (holding(0, 300, 10240),))  # a new value of the same inventory
    assert from_ledger(later).topology is from_ledger(first).topology
    relinked = Node(first.node.name, first.node.cards, (Link(0, 2, 2, PcieLevel.SINGLE_SWITCH),))
    topology = from_ledger(NodeLedger(relinked)).topology
    assert topology is not None and topology.nvlinks[0][2] == 2 and topology.nvlinks[0][1] == 0
    reordered = Node(first.node.name, tuple(reversed(first.node.cards)), first.node.links)
    flipped = from_ledger(NodeLedger(reordered)).topology  # same links, cards listed the other way
    assert flipped is not None and flipped.nvlinks[3][2] == 4 and flipped.nvlinks[0][1] == 4


def test_place_prefers_the_node_that_fits_and_names_cards() -> None:
    small = flat_node("small", "T4", 1, 8000, 32768)
    big = flat_node("big", "T4", 4, 64000, 262144)
    decision = place([small, big], gpu_ask(2, cpu_milli=1000), make_policy("bestfit"))
    assert isinstance(decision, Decision)
    assert (decision.node, decision.cards) == ("big", (0, 1))


def test_place_reports_every_node_when_nothing_fits() -> None:
    nodes = [flat_node("a", "A100", 1, 1000, 1024), flat_node("b", "V100", 2, 64000, 65536)]
    ask = gpu_ask(1, models=frozenset({"A100"}), cpu_milli=2000)
    result = place(nodes, ask, make_policy("fgd"))
    assert isinstance(result, NoFit)
    assert dict(result.reasons) == {
        "a": "1000m CPU free, 1000m short of 2000m",
        "b": "no card of model A100 (has V100)",
    }
    assert result.describe().startswith("a: 1000m CPU free")


def test_place_skips_stale_nodes_and_unhealthy_cards() -> None:
    stale = from_ledger(ledger(), stale=True)
    sick = from_ledger(
        NodeLedger(Node(NodeName("sick"), (card(0, health=Health.UNHEALTHY), card(1)))),
    )
    decision = place([stale, sick], gpu_ask(1), make_policy("default", TYPICAL))
    assert isinstance(decision, Decision)
    assert decision.node == "sick"
    assert decision.cards == (1,)
    assert isinstance(place([stale], gpu_ask(1), make_policy("default")), NoFit)


def test_place_uses_topology_on_live_nodes() -> None:
    decision = place([from_ledger(ledger(holding(0, 1000, 0)))], gpu_ask(2), make_policy("binpack"))
    assert isinstance(decision, Decision)
    assert decision.cards == (2, 3)


def test_filter_nodes_gives_reasons() -> None:
    nodes = [dgx1(), flat_node("cpu-poor", "V100", 8, 100, 1 << 20)]
    fits, failed = filter_nodes(nodes, gpu_ask(4, cpu_milli=1000))
    assert fits == ("dgx1",)
    assert failed == {"cpu-poor": "100m CPU free, 900m short of 1000m"}


def test_score_nodes_is_zero_to_ten() -> None:
    nodes = [
        flat_node("empty", "T4", 4, 64000, 262144),
        from_ledger(ledger(holding(0, 1000, 0))),
        flat_node("tiny", "T4", 1, 100, 100),
    ]
    scores = score_nodes(nodes, gpu_ask(1, cpu_milli=1000), make_policy("binpack"))
    assert scores["tiny"] == 0
    assert scores["gpu-a"] == 10
    assert 0 <= scores["empty"] < 10


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_places_on_a_fitting_node(policy: str) -> None:
    nodes = [flat_node("full", "T4", 1, 0, 0), flat_node("ok", "T4", 2, 16000, 65536)]
    result = place(nodes, gpu_ask(1, core_milli=300, cpu_milli=100), make_policy(policy, TYPICAL),
                   rng=Random(1))  # fmt: skip
    assert isinstance(result, Decision)
    assert result.node == "ok"


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="unknown policy"):
        make_policy("nope")


def test_shares_map_decision_to_ledger_shares() -> None:
    node = ledger().node
    ask = gpu_ask(2, core_milli=250, mem_mib=1024)
    got = shares(node, ask, Decision("gpu-a", (1, 3), 0.0))
    assert [(s.uuid, s.core_milli, s.mem_mib) for s in got] == [
        ("GPU-1", 250, 1024),
        ("GPU-3", 250, 1024),
    ]
    assert shares(node, Ask(None, 100), Decision("gpu-a", (), 0.0)) == ()
