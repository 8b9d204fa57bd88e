"""The trace replay on small synthetic traces, checked by the independent checker."""

from __future__ import annotations

import json
from pathlib import Path
from random import Random

import pytest

from gpuledger_core.packing import Decision, Workload, flat_node, gpu_ask, place
from gpuledger_core.packing.default import Default
from gpuledger_sim import check, cli
from gpuledger_sim.replay import Attempt, Config, arrival_order, replay, supply_of, typical_of
from gpuledger_sim.trace import TraceNode, TracePod, read_nodes, read_pods

pytestmark = pytest.mark.timeout(20)

NODES = """sn,cpu_milli,memory_mib,gpu,model
node-a,32000,131072,4,A
node-b,16000,65536,2,B
node-c,64000,262144,8,A
node-d,8000,32768,1,B
"""


def pods_csv(rng: Random, count: int, five_columns: bool = False) -> str:
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"
    if not five_columns:
        header += ",gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
    lines = [header]
    for i in range(count):
        gpus = rng.choice([0, 1, 1, 1, 2, 4])
        milli = rng.choice([200, 470, 810, 1000]) if gpus == 1 else (1000 if gpus else 0)
        spec = rng.choice(["", "", "A", "A|B"]) if gpus else ""
        cpu, mem = rng.choice([1000, 4000, 8000]), rng.choice([1024, 8192])
        row = f"pod-{i:04d},{cpu},{mem},{gpus},{milli}"
        lines.append(row if five_columns else f"{row},{spec},LS,Running,0,,0")
    return "\n".join(lines) + "\n"


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(pods_csv(Random(3), 40))
    return nodes, pods


@pytest.mark.parametrize("policy", ["default", "fgd", "bestfit", "random", "gpupacking"])
def test_replay_passes_the_independent_check(
    trace: tuple[Path, Path], tmp_path: Path, policy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    out = tmp_path / "placements.jsonl"
    argv = ["--nodes", str(nodes), "--pods", str(pods), "--policy", policy, "--seed", "5"]
    assert cli.main([*argv, "--json", "--placements", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pods"] == len(out.read_text().splitlines())
    assert summary["placed"] > 0
    assert summary["failed"] > 0  # 1.3x capacity: some must fail
    assert check.main([str(out), "--nodes", str(nodes)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["violation_count"] == 0
    assert report["unallocated_gpu_pct_at_100"] == summary["unallocated_gpu_pct_at_100"]


def test_checker_catches_an_overfilled_card(trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, _ = trace
    line = {"seq": 0, "pod": "p", "cpu_milli": 1, "memory_mib": 1, "num_gpu": 1,
            "gpu_milli": 600, "gpu_spec": "", "node": "node-d", "cards": [0]}  # fmt: skip
    lines = [json.dumps(line), json.dumps({**line, "seq": 1, "pod": "q"})]
    report = check.check(lines, check.load_nodes(nodes))
    assert report.violations == ["line 2 (q): card(s) [0] of node-d over capacity"]


def test_checker_catches_cpu_model_and_card_errors(trace: tuple[Path, Path]) -> None:
    nodes, _ = trace
    base = {"seq": 0, "pod": "p", "cpu_milli": 1, "memory_mib": 1, "num_gpu": 1,
            "gpu_milli": 1000, "gpu_spec": "", "node": "node-d", "cards": [0]}  # fmt: skip
    bad = [
        {**base, "cpu_milli": 9000},
        {**base, "gpu_spec": "A"},
        {**base, "cards": [1]},
        {**base, "num_gpu": 2, "cards": [0, 0]},
    ]
    for entry in bad:
        report = check.check([json.dumps(entry)], check.load_nodes(nodes))
        assert len(report.violations) == 1, entry


def test_same_seed_same_result_other_seed_other_order(trace: tuple[Path, Path]) -> None:
    nodes, pods = read_nodes(trace[0]), read_pods(trace[1])
    one, two = (replay(nodes, pods, Config("default", 1)) for _ in range(2))
    one.runtime_s = two.runtime_s = 0.0
    assert one == two
    orders = {tuple(p.name for p in arrival_order(pods, Random(s), 1.3, 15000)) for s in (1, 2)}
    assert len(orders) == 2
    assert one.unallocated_gpu_pct_at_100 is not None


def test_tune_appends_copies_up_to_the_target() -> None:
    pods = [TracePod(f"p{i}", 1000, 1024, 1, 500) for i in range(10)]  # 5000 milli
    order = arrival_order(pods, Random(0), 1.3, 10000)
    total = sum(p.gpu_total for p in order)
    assert sorted(p.name for p in order[:10]) == sorted(p.name for p in pods)
    assert all("-tuned-" in p.name for p in order[10:])
    assert 12500 < total <= 13000


def test_model_constraints_hold(trace: tuple[Path, Path]) -> None:
    nodes, pods = read_nodes(trace[0]), read_pods(trace[1])
    model = {n.name: n.model for n in nodes}
    seen: list[Attempt] = []
    replay(nodes, pods, Config("default", 9), seen.append)
    placed = [a for a in seen if a.node is not None and a.pod.num_gpu]
    assert placed
    for attempt in placed:
        assert not attempt.pod.models or model[attempt.node or ""] in attempt.pod.models


def test_five_column_pod_files_and_human_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = tmp_path / "n.csv", tmp_path / "p.csv"
    nodes.write_text(NODES)
    pods.write_text(pods_csv(Random(4), 30, five_columns=True))
    assert cli.main(["--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit"]) == 0
    text = capsys.readouterr().out
    assert "unallocated GPU at 100% arrived:" in text
    assert "policy bestfit" in text


def test_bad_input_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = tmp_path / "n.csv", tmp_path / "p.csv"
    nodes.write_text(NODES)
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1,2,500\n")
    assert cli.main(["--nodes", str(nodes), "--pods", str(pods)]) == 2
    assert "several GPUs must take them whole" in capsys.readouterr().err


def test_supply_is_the_cards_per_model() -> None:
    nodes = [TraceNode("a", 8000, 1024, 2, "T4"), TraceNode("b", 8000, 1024, 8, "G2"), TraceNode("c", 0, 0, 2, "T4")]
    assert supply_of(nodes) == {"T4": 4, "G2": 8}


def test_pods_that_may_go_anywhere_leave_the_scarce_model_to_those_that_need_it() -> None:
    # two T4 cards on a CPU-rich node, 32 G2 cards on CPU-poor ones; four pods need T4
    nodes = [TraceNode("t4", 104000, 1 << 19, 2, "T4")]
    nodes += [TraceNode(f"g2-{i}", 48000, 1 << 19, 8, "G2") for i in range(4)]
    pods = [TracePod(f"light-{i:02d}", 2000, 1024, 1, 1000) for i in range(20)]
    pods += [TracePod(f"heavy-{i}", 16000, 1024, 1, 1000) for i in range(6)]
    pods += [TracePod(f"t4-{i}", 4000, 1024, 1, 1000, "T4") for i in range(4)]
    for seed in range(10):
        attempts: list[Attempt] = []
        replay(nodes, pods, Config("default", seed, tune=0), attempts.append)
        assert [a.pod.gpu_spec for a in attempts if a.node is None] == ["T4", "T4"]  # no room for them
        assert all(a.pod.gpu_spec == "T4" for a in attempts if a.node == "t4")
    # the replay gives default the cards per model: without them, the balance sends a CPU-heavy
    # pod to the CPU-rich T4 node
    states = [flat_node(n.name, n.model, n.gpus, n.cpu_milli, n.memory_mib) for n in nodes]
    heavy = gpu_ask(1, cpu_milli=16000, memory_mib=1024)
    without = place(states, heavy, Default(Workload.of([typical_of(p) for p in pods])))
    assert isinstance(without, Decision) and without.node == "t4"
