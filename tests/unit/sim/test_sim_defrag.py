"""Defragmentation in the FGD replay: pods moved for a pod that fits nowhere, within the budget,
only where they fit again (host included), and the replay's node states kept equal to the ledgers."""

from __future__ import annotations

from pathlib import Path
from random import Random

import pytest

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.packing import NodeChooser, flat_node, make_policy
from gpuledger_sim import cli
from gpuledger_sim.defrag import Budget, Holdings
from gpuledger_sim.replay import Config, ask_of, rebuilt, replay
from gpuledger_sim.trace import TraceNode, TracePod

from .test_sim_replay import NODES, pods_csv

pytestmark = pytest.mark.timeout(20)

POLICY = make_policy("default")


def pod(name: str, milli: int, cpu: int = 1000) -> TracePod:
    return TracePod(name, cpu, 1024, 1, milli)


class Small:
    """Nodes with the given pods placed on card 0 of each, as the replay holds them."""

    def __init__(self, nodes: list[TraceNode], placed: list[tuple[int, TracePod]], budget: Budget):
        self.empty = [flat_node(n.name, n.model, n.gpus, n.cpu_milli, n.memory_mib) for n in nodes]
        self.holdings = Holdings(nodes, POLICY, budget)
        for at, p in placed:
            self.holdings.add(at, p.name, ask_of(p), (0,))
        self.states = [rebuilt(self.empty[at], self.holdings.placed_on(at)) for at in range(len(nodes))]

    def make_room(self, p: TracePod) -> list[int]:
        changed = self.holdings.make_room(p.name, ask_of(p), self.states)
        for at in changed:
            self.states[at] = rebuilt(self.empty[at], self.holdings.placed_on(at))
        return changed

    def fits(self, p: TracePod) -> int | None:
        found = NodeChooser(list(self.states), POLICY).choose(ask_of(p))
        return None if found is None else found[0]

    def rooms(self, at: int) -> list[int]:
        return [c.room for c in self.states[at].cards]


def one_card(name: str, cpu: int = 8000) -> TraceNode:
    return TraceNode(name, cpu, 32768, 1, "A")


def test_one_pod_moves_to_where_it_fits_and_the_whole_card_pod_then_fits() -> None:
    # a holds 300, b holds 600: a whole-card pod fits nowhere; 300 moves to b (400 free), a is free.
    small = Small([one_card("a"), one_card("b")], [(0, pod("p300", 300)), (1, pod("p600", 600))], Budget(1))
    whole = pod("whole", 1000)
    assert small.fits(whole) is None
    assert small.make_room(whole) == [0, 1]
    assert small.fits(whole) == 0
    assert small.rooms(0) == [1000] and small.rooms(1) == [100]
    assert [p.name for p in small.holdings.placed_on(1)] == ["p600", "p300"]
    ledger_b = small.holdings.ledgers[1]
    assert sorted(a.id for a in ledger_b.live()) == ["p300", "p600"] and not small.holdings.ledgers[0].live()
    assert small.holdings.tally.moves == 1 and small.holdings.tally.searched == 1


def test_the_budget_bounds_the_moves_per_pod_and_in_all() -> None:
    # Two 300s on a: two moves are needed (b and c take one each).
    nodes = [one_card("a"), one_card("b"), one_card("c")]
    placed = [(0, pod("x", 300)), (0, pod("y", 300)), (1, pod("b6", 600)), (2, pod("c6", 600))]
    assert Small(nodes, placed, Budget(1)).make_room(pod("whole", 1000)) == []
    assert Small(nodes, placed, Budget(2, total=1)).make_room(pod("whole", 1000)) == []
    small = Small(nodes, placed, Budget(2, total=2))
    assert sorted(small.make_room(pod("whole", 1000))) == [0, 1, 2]
    assert small.holdings.tally.moves == 2
    assert small.make_room(pod("again", 1000)) == []  # the total is spent


def test_no_move_where_a_host_lacks_cpu_for_the_moved_pod_or_the_pod() -> None:
    whole = pod("whole", 1000, cpu=2000)
    # b's host has 1000 CPU left: the 300 pod, asking 2000, may not go there.
    small = Small([one_card("a"), one_card("b", cpu=2000)], [(0, pod("p300", 300, cpu=2000)),
                  (1, pod("p600", 600))], Budget(1))  # fmt: skip
    assert small.make_room(whole) == [] and small.holdings.tally.moves == 0
    # a's host has 1000 CPU left: the whole-card pod, asking 2000, would not fit there cleared.
    small = Small([one_card("a", cpu=7000), one_card("b")], [(0, pod("p300", 300, cpu=6000)),
                  (1, pod("p600", 600, cpu=2000))], Budget(1))  # fmt: skip
    assert small.make_room(whole) == [] and small.holdings.tally.searched == 1


def test_nothing_is_searched_when_no_card_could_take_any_pod_that_would_move() -> None:
    # Only a is searched (it lacks least); no card but its own has room for its 300 pod.
    placed = [(0, pod("p300", 300)), (1, pod("p800", 800))]
    small = Small([one_card("a"), one_card("b")], placed, Budget(4, nodes=1))
    assert small.make_room(pod("whole", 1000)) == []
    assert small.holdings.tally.no_destination == 1


def test_a_budget_that_makes_no_sense_is_refused() -> None:
    for per_pod, total, nodes in ((0, None, 16), (-1, None, 16), (1, -1, 16), (1, None, 0)):
        with pytest.raises(InvalidArgument):
            Budget(per_pod, total, nodes)
    assert Budget.parse("2:50", 8) == Budget(2, 50, 8)
    with pytest.raises(InvalidArgument, match="MOVES or MOVES:TOTAL"):
        Budget.parse("two")


def test_the_replay_with_defragmentation_places_more_and_reports_its_moves() -> None:
    nodes = [TraceNode(f"n{i}", 64000, 262144, 2, "A") for i in range(6)]
    rng = Random(6)  # a trace whose replay leaves whole-card pods out that two moves let in
    pods = [pod(f"p{i:03d}", rng.choice([300, 300, 600, 1000])) for i in range(40)]
    without = replay(nodes, pods, Config(seed=3))
    with_ = replay(nodes, pods, Config(seed=3, defrag=Budget(2)))
    assert "defrag_moves" not in without.extra
    assert with_.extra["defrag_moves"] == 2 and with_.extra["defrag_pods_let_in"] >= 1
    assert with_.unallocated_gpu_pct_at_100 is not None and without.unallocated_gpu_pct_at_100 is not None
    assert with_.unallocated_gpu_pct_at_100 < without.unallocated_gpu_pct_at_100
    assert with_.extra["defrag_moves_per_1000_pods"] > 0


def test_the_cli_takes_the_budget_and_refuses_bad_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(pods_csv(Random(3), 40))
    argv = ["--nodes", str(nodes), "--pods", str(pods)]
    assert cli.main([*argv, "--defrag", "2:10", "--defrag-nodes", "4"]) == 0
    assert "defragmentation to 100% arrived" in capsys.readouterr().out
    for bad, says in (
        (["--defrag", "-1"], "moves per pod must be 1 or more"),
        (["--defrag", "1:-3"], "total of moves must be 0 or more"),
        (["--defrag", "1", "--defrag-nodes", "0"], "--defrag-nodes"),
        (["--defrag-nodes", "4"], "only with --defrag"),
        (["--defrag-nodes", "16"], "only with --defrag"),
        (["--defrag", "1", "--path", "dra"], "classic path only"),
        (["--defrag", "1", "--placements", str(tmp_path / "p.jsonl")], "do not record moves"),
        (["--defrag", "1", "--preemption", "ledger"], "--defrag"),
    ):
        assert cli.main([*argv, *bad]) == 2
        assert says in capsys.readouterr().err


def test_no_move_where_the_pods_moved_to_one_node_together_pass_its_host() -> None:
    # a: two 150 shares of 2000 CPU each; b: a 700 share of 5000, its host with 3000 CPU left. Each
    # 150 alone fits b, both do not (4000); b's 700 fits a's card but not a's host (4000 left).
    nodes = [TraceNode("a", 8000, 32768, 1, "A"), TraceNode("b", 8000, 32768, 1, "A")]
    placed = [(0, pod("x1", 150, cpu=2000)), (0, pod("x2", 150, cpu=2000)), (1, pod("y", 700, cpu=5000))]
    small = Small(nodes, placed, Budget(2))
    assert small.make_room(pod("whole", 1000)) == []
    assert small.holdings.tally.refused_by_host == 1 and small.holdings.tally.moves == 0
    roomy = Small([nodes[0], TraceNode("b", 9000, 32768, 1, "A")], placed, Budget(2))
    assert sorted(roomy.make_room(pod("whole", 1000))) == [0, 1]
