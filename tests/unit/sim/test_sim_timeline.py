"""The timeline replay (departures, waits, preemption strategies) on hand-made traces whose
outcome can be worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import CardShare, Grant
from gpuledger_core.packing import make_policy
from gpuledger_sim import cli, preempting
from gpuledger_sim.cluster import Cluster, Job
from gpuledger_sim.timeline import PRIORITIES, job_of, run_timeline, subset
from gpuledger_sim.timeline_figures import Figures, percentile
from gpuledger_sim.trace import TimedPod, TraceNode, TracePod, read_timed_pods

pytestmark = pytest.mark.timeout(20)

ONE_CARD = [TraceNode("node-a", 64000, 262144, 1, "T4")]
TWO_CARDS = [TraceNode("node-a", 64000, 262144, 2, "T4")]
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"


def timed(name: str, qos: str, created: int, duration: int, milli: int = 1000, gpus: int = 1) -> TimedPod:
    pod = TracePod(name, 1000, 1024, gpus, milli if gpus else 0)
    return TimedPod(pod, qos, created, created + duration, created)


def split_shares() -> list[TimedPod]:
    """Two cards, each 900 ‰ held by two best-effort shares (a 600 ‰ on each, then a 300 ‰ on
    each), and a latency-sensitive 700 ‰ share at t=10 that fits on neither card."""
    return [
        timed("a", "BE", 0, 1000, 600),
        timed("c", "BE", 1, 1000, 600),
        timed("b", "BE", 2, 1000, 300),
        timed("d", "BE", 3, 1000, 300),
        timed("high", "LS", 10, 100, 700),
    ]


def started_cluster(nodes: list[TraceNode], held: list[tuple[TimedPod, int]]) -> Cluster:
    """A cluster with each pod started at its creation on the given card of the first node."""
    cluster = Cluster(nodes, make_policy("default", []))
    for pod, index in held:
        card = cluster.ledgers[0].node.cards[index]
        grants = (Grant("main", (CardShare(card.uuid, index, 0, pod.pod.gpu_milli),)),)
        assert cluster.start_on(0, job_of(pod), pod.created, grants) is not None
    return cluster


def victims_cards(cluster: Cluster, names: tuple[str, ...]) -> set[int]:
    """The cards the named pods hold."""
    cards = set()
    for name in names:
        allocation = cluster.running[name].allocation
        assert allocation is not None
        cards |= {share.index for share in allocation.shares()}
    return cards


def test_kube_evicts_by_the_node_count_on_both_cards_and_the_ledger_on_one_card() -> None:
    a, c, b, d, high = split_shares()
    cluster = started_cluster(TWO_CARDS, [(a, 0), (b, 0), (c, 1), (d, 1)])
    job = job_of(high)
    assert cluster.place(job, 10) is None
    # kube: 200 ‰ free by count; without a, b, c, d 2,000 ‰. Given back, the earliest started
    # first: a (the rest free 1,200 + 200), c (600 + 200), not b (300 + 200 < 700), not d: b and
    # d, one on each card, which leaves 400 ‰ free on each.
    kube = preempting.kube(cluster, job, 10)
    assert kube is not None and set(kube.victims) == {"b", "d"}
    assert victims_cards(cluster, kube.victims) == {0, 1}
    # The ledger: one 600 ‰ share frees 700 ‰ on its card; c's, which ran least.
    ours = preempting.ledger(cluster, job, 10)
    assert ours is not None and ours.victims == ("c",)
    assert ours.grants is not None and ours.grants[0].cards[0].index == 1


def test_through_the_timeline_kube_evicts_in_vain_and_the_ledger_starts_the_pod_at_once() -> None:
    kube = run_timeline(TWO_CARDS, split_shares(), "kube")
    ours = run_timeline(TWO_CARDS, split_shares(), "ledger")
    assert ours.high_waits == [0.0] and ours.evictions == 1 and ours.futile == 0
    assert ours.gpu_hours_lost == pytest.approx(0.6 * 9 / 3600)  # c, 600 ‰, started at 1, evicted at 10
    assert kube.futile >= 1 and kube.evictions >= 2 and kube.high_waits[0] > 0


def test_without_preemption_the_pod_waits_for_a_departure() -> None:
    pods = [timed("a", "BE", 0, 100), timed("b", "LS", 10, 50)]
    found = run_timeline(ONE_CARD, pods, "none")
    assert found.high_waits == [90.0] and found.evictions == 0 and found.never_started == 0


@pytest.mark.parametrize("strategy", ["kube", "ledger"])
def test_a_pod_of_equal_priority_is_never_evicted(strategy: str) -> None:
    pods = [timed("a", "LS", 0, 100), timed("b", "LS", 10, 50)]
    found = run_timeline(ONE_CARD, pods, strategy)
    assert found.evictions == 0 and sorted(found.high_waits) == [0.0, 90.0]


@pytest.mark.parametrize("strategy", ["kube", "ledger"])
def test_an_evicted_pod_loses_its_work_and_starts_over(strategy: str) -> None:
    pods = [timed("low", "BE", 0, 100), timed("high", "LS", 50, 10), timed("tail", "BE", 0, 200, gpus=0)]
    found = run_timeline(ONE_CARD, pods, strategy)
    assert found.evictions == 1 and found.preemptions == 1 and found.high_waits == [0.0]
    assert found.gpu_hours_lost == pytest.approx(50 / 3600)
    # The card is held 0-50 by low, 50-60 by high, then 60-160 by low again, of a 200 s span.
    assert found.unallocated_mean_pct == pytest.approx(100 * 40 / 200)
    assert found.never_started == 0 and found.unfinished == 0


def test_unallocated_gpu_is_sampled_over_the_span() -> None:
    pods = [timed("a", "BE", 0, 100), timed("cpu", "BE", 0, 200, gpus=0)]
    found = run_timeline(ONE_CARD, pods, "none")
    assert [value for _, value in found.samples] == [0.0] * 10 + [100.0] * 11
    assert [at for at, _ in found.samples][:3] == [0.0, 10.0, 20.0]
    assert found.unallocated_mean_pct == pytest.approx(50.0)


def test_a_pod_that_fits_no_node_is_counted_as_never_started() -> None:
    found = run_timeline(ONE_CARD, [timed("big", "LS", 0, 10, gpus=2)], "ledger")
    assert found.never_started == 1 and found.never_fits == 1 and found.high_never_started == 1


def test_pending_pods_start_by_priority_then_arrival() -> None:
    pods = [timed("a", "LS", 0, 100), timed("be", "BE", 5, 10), timed("ls", "LS", 6, 10), timed("ls2", "LS", 7, 10)]
    found = run_timeline(ONE_CARD, pods, "none")
    assert found.high_waits == [0.0, 94.0, 103.0]  # ls at 100, ls2 at 110; be only after both


def test_qos_classes_map_to_priorities_with_ls_highest() -> None:
    assert PRIORITIES["LS"] > PRIORITIES["Guaranteed"] > PRIORITIES["Burstable"] > PRIORITIES["BE"]
    with pytest.raises(InvalidArgument, match="QoS class 'XX'"):
        job_of(timed("odd", "XX", 0, 1))


def test_the_timed_trace_reads_times_and_a_pod_that_never_ran(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(f"{HEADER}\np-0,1000,1024,1,500,,LS,Running,10,70,30\np-1,1000,1024,0,0,,BE,Pending,5,25,\n")
    ran, waited = read_timed_pods(path)
    assert (ran.qos, ran.created, ran.scheduled, ran.duration) == ("LS", 10, 30, 40)
    assert (waited.scheduled, waited.duration) == (None, 20)
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-0,1,1,1,1000\n")
    with pytest.raises(InvalidArgument, match="missing column"):
        read_timed_pods(path)


def test_a_subset_holds_at_least_the_gpus_asked_and_depends_on_the_seed() -> None:
    nodes = [TraceNode(f"n-{i:02d}", 1000, 1024, 1 + i % 4, "T4") for i in range(40)]
    picked = subset(nodes, 12, seed=1)
    assert 12 <= sum(n.gpus for n in picked) < 12 + 4
    assert picked == subset(nodes, 12, seed=1) and picked != subset(nodes, 12, seed=2)


def test_percentiles_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0 and percentile([], 0.5) is None


def test_the_cli_prints_each_strategy_and_the_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nnode-a,64000,262144,2,T4\n")
    rows = [f"{p.pod.name},1000,1024,1,{p.pod.gpu_milli},,{p.qos},Running,{p.created},{p.deleted},{p.created}"
            for p in split_shares()]  # fmt: skip
    pods.write_text("\n".join([HEADER, *rows]) + "\n")
    code = cli.main(["--nodes", str(nodes), "--pods", str(pods), "--preemption", "none,kube,ledger"])
    out = capsys.readouterr().out
    assert code == 0
    assert [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")][1:4] == [
        "none", "kube", "ledger"
    ]  # fmt: skip
    assert "ledger / kube: evictions" in out
    assert cli.main(["--nodes", str(nodes), "--pods", str(pods), "--preemption", "kube,random"]) == 2
    assert cli.main(["--nodes", str(nodes), "--pods", str(pods), "--preemption", "kube", "--gpus", "-1"]) == 2


def test_figures_of_no_high_priority_pod_say_so() -> None:
    assert Figures("none", 1, 1, 0).evictions_per_high == 0.0 and Figures("none", 1, 1, 0).wait_p50 is None


def test_a_job_runs_for_its_duration_in_the_trace() -> None:
    job = job_of(TimedPod(TracePod("p", 1, 1, 1, 1000), "BE", 5, 65, 15))
    assert job == Job(job.pod, PRIORITIES["BE"], 5, 50)


@pytest.mark.parametrize("nominated", [0, 1])
def test_a_node_nominated_for_a_pending_pod_takes_no_lower_pod_its_counts_keep_for_it(nominated: int) -> None:
    nodes = [TraceNode("node-a", 64000, 262144, 1, "T4"), TraceNode("node-b", 64000, 262144, 1, "T4")]
    cluster = Cluster(nodes, make_policy("default", []))
    high = job_of(timed("high", "LS", 0, 10))
    cluster.nominated["high"] = (nominated, high)
    low = cluster.place(job_of(timed("low", "BE", 0, 10)), 0)
    assert low is not None and low.at == 1 - nominated
    assert cluster.place(job_of(timed("low-2", "BE", 0, 10)), 0) is None  # the card left is kept
    started = cluster.place(high, 0)
    assert started is not None and started.at == nominated and not cluster.nominated


def test_on_a_fragmented_node_kube_sees_room_and_waits_where_the_ledger_evicts_one() -> None:
    # 400 ‰ free on each card: 800 ‰ by the node's count, enough for 700 ‰ by kube-scheduler's
    # reckoning, on no card by the ledger's.
    pods = [timed("a", "BE", 0, 1000, 600), timed("b", "BE", 1, 1000, 600), timed("high", "LS", 10, 100, 700)]
    kube = run_timeline(TWO_CARDS, pods, "kube")
    ours = run_timeline(TWO_CARDS, pods, "ledger")
    assert kube.evictions == 0 and kube.high_waits == [990.0]  # until a leaves at 1,000
    assert ours.evictions == 1 and ours.high_waits == [0.0] and ours.unseen_by_kube == 1
