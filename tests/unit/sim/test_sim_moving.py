"""Defragmentation in the timeline replay: running pods moved so that a pending pod starts, before
anyone is evicted (``defrag+ledger``: lower-priority pods only) or where preemption finds nobody
(``ledger+defrag``: peers too); within the budget per pod and per hour, never a pod moved within
its cool-down, only where hosts fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import CardShare, Grant
from gpuledger_core.packing import make_policy
from gpuledger_sim import cli
from gpuledger_sim.cluster import Cluster
from gpuledger_sim.moving import Mover, Moving
from gpuledger_sim.preempting import MOVING
from gpuledger_sim.timeline import Timeline, job_of
from gpuledger_sim.trace import TimedPod, TraceNode, TracePod

from .test_sim_timeline import HEADER

pytestmark = pytest.mark.timeout(20)


def node(name: str, cpu: int = 64000) -> TraceNode:
    return TraceNode(name, cpu, 262144, 1, "T4")


def timed(name: str, qos: str, created: int, milli: int, cpu: int = 1000, duration: int = 100_000) -> TimedPod:
    return TimedPod(TracePod(name, cpu, 1024, 1, milli), qos, created, created + duration, created)


def cluster_of(nodes: list[TraceNode], held: list[tuple[TimedPod, int]]) -> Cluster:
    """Each pod started at its creation on card 0 of the node at the given position."""
    cluster = Cluster(nodes, make_policy("default", []))
    for pod, at in held:
        card = cluster.ledgers[at].node.cards[0]
        grants = (Grant("main", (CardShare(card.uuid, 0, 0, pod.pod.gpu_milli),)),)
        assert cluster.start_on(at, job_of(pod), pod.created, grants) is not None
    return cluster


def fragmented(cpu_b: int = 64000, x: str = "BE", y: str = "BE") -> Cluster:
    """a: a 300 ‰ share x; b: a 600 ‰ share y, started before x. A whole card fits nowhere; either
    share fits beside the other, and x, which ran less, is the cheaper to move."""
    return cluster_of([node("a"), node("b", cpu_b)], [(timed("x", x, 1, 300), 0), (timed("y", y, 0, 600), 1)])


WHOLE_LS = timed("high", "LS", 10, 1000, duration=100)
FIRST, AFTER = MOVING["defrag+ledger"], MOVING["ledger+defrag"]  # moves before preemption, or after


def test_the_mover_moves_the_small_share_beside_the_large_one_and_clears_a_card() -> None:
    found = Mover(fragmented(), Moving(), FIRST).plan(job_of(WHOLE_LS), 10)
    assert found is not None and found.node == "a"
    assert [(m.allocation.owner.id, m.to) for m in found.moves] == [("x", "b")]


def test_through_the_timeline_a_move_replaces_the_eviction_and_costs_the_moved_pods_work() -> None:
    moved = Timeline(fragmented(), [job_of(WHOLE_LS)], "defrag+ledger").run()
    assert (moved.moves, moved.moved_for, moved.evictions, moved.high_waits) == (1, 1, 0, [0])
    assert moved.gpu_hours_lost == moved.gpu_hours_lost_to_moves == pytest.approx(0.3 * 9 / 3600)
    evicted = Timeline(fragmented(), [job_of(WHOLE_LS)], "ledger").run()
    assert (evicted.moves, evicted.evictions, evicted.high_waits) == (0, 1, [0])


def test_the_hourly_budget_and_the_cool_down_send_the_next_pod_to_preemption() -> None:
    # Two whole-card LS pods, 60 s apart; c and d hold what a and b hold. The first clears c (w,
    # the youngest, beside x); the second then needs two moves (x and w off a, one to b, one to d).
    nodes = [node("a"), node("b"), node("c"), node("d")]
    held = [(timed("x", "BE", 1, 300), 0), (timed("y", "BE", 0, 600), 1), (timed("w", "BE", 3, 300), 2),
            (timed("z", "BE", 2, 600), 3)]  # fmt: skip
    jobs = [job_of(WHOLE_LS), job_of(timed("later", "LS", 70, 1000, duration=100))]
    both = Timeline(cluster_of(nodes, held), jobs, "defrag+ledger", Moving(per_hour=3, cooldown_s=30)).run()
    assert (both.moves, both.evictions, both.high_waits) == (3, 0, [0, 0])
    short = Timeline(cluster_of(nodes, held), jobs, "defrag+ledger", Moving(per_hour=2, cooldown_s=30)).run()
    assert (short.moves, short.evictions) == (1, 1)
    cooling = Timeline(cluster_of(nodes, held), jobs, "defrag+ledger", Moving(per_hour=3)).run()
    assert (cooling.moves, cooling.evictions) == (1, 1)  # w, moved at 10, may not move at 70
    window = Mover(fragmented(), Moving(per_hour=1), FIRST)
    window.moved("elsewhere", 0)
    assert window.plan(job_of(WHOLE_LS), 3599) is None  # the move at 0 is within the hour
    assert window.plan(job_of(WHOLE_LS), 3600) is not None  # and then no more


def test_a_pod_moved_within_its_cool_down_stays() -> None:
    mover = Mover(fragmented(), Moving(cooldown_s=3600), FIRST)
    mover.moved("x", 5)
    found = mover.plan(job_of(WHOLE_LS), 10)
    assert found is not None and [m.allocation.owner.id for m in found.moves] == ["y"]
    mover.moved("y", 5)
    assert mover.plan(job_of(WHOLE_LS), 10) is None
    cooled = Mover(fragmented(), Moving(cooldown_s=4), FIRST)
    cooled.moved("x", 5)
    cooled.moved("y", 5)
    assert cooled.plan(job_of(WHOLE_LS), 10) is not None


def test_moves_first_take_only_pods_of_lower_priority_as_only_they_could_be_evicted() -> None:
    be_whole = job_of(timed("be", "BE", 10, 1000))
    assert Mover(fragmented(), Moving(), FIRST).plan(be_whole, 10) is None  # its peers stay
    found = Mover(fragmented(x="LS"), Moving(), FIRST).plan(job_of(WHOLE_LS), 10)
    assert found is not None and [m.allocation.owner.id for m in found.moves] == ["y"]  # x is LS too
    assert Mover(fragmented(x="LS", y="LS"), Moving(), FIRST).plan(job_of(WHOLE_LS), 10) is None
    assert Mover(fragmented(), Moving(), AFTER).plan(be_whole, 10) is not None  # after preemption: peers
    assert Mover(fragmented(x="LS", y="LS"), Moving(), AFTER).plan(be_whole, 10) is None  # never above


def test_after_preemption_moves_only_for_a_pod_that_nobody_below_it_makes_room_for() -> None:
    be_whole = job_of(timed("be", "BE", 10, 1000))
    peers = Timeline(fragmented(), [be_whole], "ledger+defrag").run()
    assert (peers.moves, peers.moved_for, peers.evictions) == (1, 1, 0)
    assert (Timeline(fragmented(), [be_whole], "defrag+ledger").run().moves) == 0  # it waits
    evicts = Timeline(fragmented(), [job_of(WHOLE_LS)], "ledger+defrag").run()
    assert (evicts.moves, evicts.evictions, evicts.high_waits) == (0, 1, [0])


def test_a_pod_moves_only_where_the_host_has_its_cpu() -> None:
    # b's host has 500 CPU left beside y: x, asking 1000, may not go there; y goes to a instead.
    found = Mover(fragmented(cpu_b=1500), Moving(), FIRST).plan(job_of(WHOLE_LS), 10)
    assert found is not None and found.node == "b"
    assert [(m.allocation.owner.id, m.to) for m in found.moves] == [("y", "a")]


def test_a_budget_that_makes_no_sense_is_refused() -> None:
    for per_pod, per_hour, cooldown in ((0, 12, 0.0), (1, 0, 0.0), (1, -1, 0.0), (1, 1, -1.0)):
        with pytest.raises(InvalidArgument):
            Moving(per_pod, per_hour, cooldown)


def test_the_cli_runs_ledger_defrag_and_refuses_a_budget_it_would_ignore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nnode-a,64000,262144,1,T4\nnode-b,64000,262144,1,T4\n")
    rows = ["x,1000,1024,1,300,,BE,Running,0,100000,0", "y,1000,1024,1,600,,BE,Running,1,100000,1",
            "z,1000,1024,1,600,,BE,Running,2,100000,2", "high,1000,1024,1,1000,,LS,Running,10,110,10"]  # fmt: skip
    pods.write_text("\n".join([HEADER, *rows]) + "\n")
    argv = ["--nodes", str(nodes), "--pods", str(pods), "--preemption", "ledger,ledger+defrag,defrag+ledger"]
    assert cli.main([*argv, "--moves-per-pod", "1", "--moves-per-hour", "4", "--move-cooldown", "60"]) == 0
    out = capsys.readouterr().out
    assert "| moves |" in out and "| ledger+defrag |" in out and "| defrag+ledger |" in out
    for bad, says in (
        (["--moves-per-hour", "-1"], "--moves-per-hour"),
        (["--move-cooldown", "-5"], "--move-cooldown"),
        (["--moves-per-pod", "0"], "--moves-per-pod"),
    ):
        assert cli.main([*argv, *bad]) == 2
        assert says in capsys.readouterr().err
    ledger_only = ["--nodes", str(nodes), "--pods", str(pods), "--preemption", "ledger", "--moves-per-hour", "4"]
    assert cli.main(ledger_only) == 2
    assert "only to the strategies that move pods" in capsys.readouterr().err
    assert cli.main(["--nodes", str(nodes), "--pods", str(pods), "--move-cooldown", "5"]) == 2
    assert "only with --preemption ledger+defrag or defrag+ledger" in capsys.readouterr().err


def test_no_move_where_the_pods_moved_to_one_node_together_pass_its_host() -> None:
    # a: two 150 shares of 2000 CPU each; b: a 700 share of 5000 on an 8000 host (3000 left). Each
    # 150 alone fits b, both do not (4000); b's 700 fits a's card but not a's host (4000 left).
    def cluster(cpu_b: int) -> Cluster:
        held = [(timed("x1", "BE", 1, 150, cpu=2000), 0), (timed("x2", "BE", 2, 150, cpu=2000), 0),
                (timed("y", "BE", 0, 700, cpu=5000), 1)]  # fmt: skip
        return cluster_of([node("a", 8000), node("b", cpu_b)], held)

    assert Mover(cluster(8000), Moving(), FIRST).plan(job_of(WHOLE_LS), 10) is None
    found = Mover(cluster(9000), Moving(), FIRST).plan(job_of(WHOLE_LS), 10)
    assert found is not None and found.node == "a" and {m.to for m in found.moves} == {"b"}
