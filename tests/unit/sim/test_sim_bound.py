"""The placement bound: never above what a placement can reach, exact where the optimum is known."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from random import Random

import pytest

from tests.requires import importable, unavailable

if not importable("highspy"):
    unavailable("highspy (the 'bound' extra)", "tox's tests env installs it; else pip install -e '.[bound]'")

from benchmarks import sim_bound
from gpuledger_core.errors import InvalidArgument
from gpuledger_sim import cli
from gpuledger_sim.bound import arrived_at_100, bound, start_from
from gpuledger_sim.replay import Attempt, Config, replay
from gpuledger_sim.trace import TraceNode, TracePod, read_nodes, read_pods
from tests.unit.sim.conftest import NODES, PODS

pytestmark = pytest.mark.timeout(60)


def node(name: str, gpus: int, cpu: int = 64000, mem: int = 262144, model: str = "A") -> TraceNode:
    return TraceNode(name, cpu, mem, gpus, model)


def pod(i: int, gpus: int, milli: int, cpu: int = 1000, mem: int = 1024, spec: str = "") -> TracePod:
    return TracePod(f"pod-{i}", cpu, mem, gpus, milli, spec)


def best_by_brute_force(nodes: list[TraceNode], pods: list[TracePod], keep: int = 0) -> int:
    """The most GPU milli any placement of a subset allocates, by trying every placement; the first
    ``keep`` pods must be placed (-1: no such placement)."""
    choices: list[list[tuple[int, tuple[int, ...]] | None]] = []
    for i, p in enumerate(pods):
        options: list[tuple[int, tuple[int, ...]] | None] = [] if i < keep else [None]
        for at, n in enumerate(nodes):
            allowed = not p.models or n.model in p.models
            if p.num_gpu and allowed:
                options += [(at, cards) for cards in itertools.combinations(range(n.gpus), p.num_gpu)]
        choices.append(options)
    best = -1 if keep else 0
    for plan in itertools.product(*choices):
        if _feasible(nodes, pods, plan):
            best = max(best, sum(p.gpu_total for p, c in zip(pods, plan, strict=True) if c))
    return best


def _feasible(
    nodes: list[TraceNode], pods: list[TracePod], plan: tuple[tuple[int, tuple[int, ...]] | None, ...]
) -> bool:
    cpu = [n.cpu_milli for n in nodes]
    mem = [n.memory_mib for n in nodes]
    cards = [[1000] * n.gpus for n in nodes]
    for p, choice in zip(pods, plan, strict=True):
        if choice is None:
            continue
        at, used = choice
        cpu[at] -= p.cpu_milli
        mem[at] -= p.memory_mib
        for c in used:
            cards[at][c] -= p.gpu_milli
    return min(cpu) >= 0 and min(mem) >= 0 and all(room >= 0 for node in cards for room in node)


def test_two_shares_that_cannot_meet_on_one_card() -> None:
    found = bound([node("n", 1)], [pod(0, 1, 600), pod(1, 1, 600)])
    assert found.converged
    assert found.most_allocated == pytest.approx(600)
    assert found.unallocated_pct == pytest.approx(40.0)


def test_cpu_strands_the_second_card() -> None:
    pods = [pod(0, 1, 1000, cpu=6000), pod(1, 1, 1000, cpu=6000)]
    found = bound([node("n", 2, cpu=8000)], pods)
    assert found.unallocated_pct == pytest.approx(50.0)


def test_memory_and_models_count() -> None:
    nodes = [node("a", 2, mem=4096, model="A"), node("b", 2, model="B")]
    pods = [pod(0, 1, 1000, mem=3000), pod(1, 1, 1000, mem=3000), pod(2, 2, 1000, spec="A")]
    # b takes no pod of spec A; a's memory holds one 3000 MiB pod, or the 2-card pod
    assert bound(nodes, pods).most_allocated == pytest.approx(best_by_brute_force(nodes, pods))


def test_whole_cards_and_shares_do_not_mix_on_a_card() -> None:
    pods = [pod(0, 1, 1000), pod(1, 1, 500), pod(2, 1, 500), pod(3, 1, 300)]
    found = bound([node("n", 2)], pods)
    assert found.most_allocated == pytest.approx(2000)


@pytest.mark.parametrize("seed", range(12))
def test_never_below_the_brute_force_optimum(seed: int) -> None:
    rng = Random(seed)
    nodes = [
        node(f"n{i}", rng.choice([1, 2, 2, 3]), rng.choice([4000, 8000, 16000]), rng.choice([8192, 32768]),
             rng.choice(["A", "B"]))
        for i in range(rng.choice([1, 2, 3]))
    ]  # fmt: skip
    pods = []
    for i in range(rng.randint(3, 6)):
        gpus = rng.choice([1, 1, 1, 2])
        milli = rng.choice([200, 470, 650, 810, 1000]) if gpus == 1 else 1000
        pods.append(pod(i, gpus, milli, rng.choice([1000, 3000, 6000]), rng.choice([1024, 8192]),
                        rng.choice(["", "", "A"])))  # fmt: skip
    best = best_by_brute_force(nodes, pods)
    found = bound(nodes, pods)
    assert found.most_allocated >= best - 1e-6
    capacity = sum(n.gpus for n in nodes) * 1000
    assert found.unallocated_pct <= 100 - 100 * best / capacity + 1e-9


def test_kept_pods_stay_placed_whatever_it_costs() -> None:
    # alone, the card goes to the whole-card pod; with the 600 share kept, only 600 can be allocated
    pods = [pod(0, 1, 600), pod(1, 1, 1000)]
    assert bound([node("n", 1)], pods).most_allocated == pytest.approx(1000)
    held = [(node("n", 1), pods[:1])]
    found = bound([node("n", 1)], pods, start=held, keep=pods[:1])
    assert found.converged
    assert found.most_allocated == pytest.approx(600)


def test_keep_needs_a_start_that_places_the_kept_pods() -> None:
    pods = [pod(0, 1, 600), pod(1, 1, 600)]  # no placement holds both on the one card
    with pytest.raises(InvalidArgument, match="places every kept pod"):
        bound([node("n", 1)], pods, keep=pods)
    with pytest.raises(InvalidArgument, match="one of the pods"):
        bound([node("n", 1)], pods[:1], keep=[pod(2, 1, 300)])


def test_with_kept_pods_never_below_the_brute_force_optimum() -> None:
    lowered = 0
    for seed in range(12):
        rng = Random(100 + seed)
        nodes = [node(f"n{i}", rng.choice([1, 2, 3]), rng.choice([4000, 8000])) for i in range(rng.choice([1, 2]))]
        pods = [pod(i, 1, rng.choice([230, 470, 650, 810, 1000]), rng.choice([1000, 3000, 6000])) for i in range(5)]
        seen: list[Attempt] = []
        replay(nodes, pods, Config("default", seed, tune=0), seen.append)
        kept = [a.pod for a in seen if a.node is not None]  # placed by a replay: a placement of them exists
        best = best_by_brute_force(nodes, kept + [p for p in pods if p not in kept], keep=len(kept))
        found = bound(nodes, pods, start=start_from(nodes, seen), keep=kept)
        free = bound(nodes, pods)
        assert best >= 0, seed
        assert found.most_allocated >= best - 1e-6, seed
        assert found.most_allocated <= free.most_allocated + 1e-6, seed
        lowered += found.most_allocated < free.most_allocated - 1e-6
    assert lowered >= 3  # keeping the replay's choices costs allocation on several of these


def test_never_above_a_replayed_placement() -> None:
    rng = Random(7)
    nodes = [node(f"n{i}", rng.choice([2, 4, 8]), rng.choice([16000, 32000, 64000])) for i in range(12)]
    pods = [
        pod(i, g, rng.choice([230, 470, 810, 1000]) if g == 1 else 1000, rng.choice([2000, 8000, 12000]))
        for i, g in enumerate(rng.choice([0, 1, 1, 1, 1, 2]) for _ in range(80))
    ]
    arrived = arrived_at_100(nodes, pods, 42, 1.3)
    found = bound(nodes, arrived)
    for policy in ("default", "fgd", "bestfit", "random"):
        ran = replay(nodes, pods, Config(policy, 42))
        assert ran.unallocated_gpu_pct_at_100 is not None
        assert found.unallocated_pct <= ran.unallocated_gpu_pct_at_100


def test_arrived_at_100_is_the_prefix_that_reaches_capacity() -> None:
    nodes = [node("n", 2)]
    pods = [pod(i, 1, 600) for i in range(6)]
    arrived = arrived_at_100(nodes, pods, 1, 0)
    assert sum(p.gpu_total for p in arrived[:-1]) < 2000 <= sum(p.gpu_total for p in arrived)


def test_cli_prints_the_bound_and_the_distance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,32000,65536,2,A\nn2,8000,65536,2,A\n")
    lines = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli"]
    lines += [f"p{i},{4000 if i % 2 else 1000},1024,1,{(470, 810, 1000)[i % 3]}" for i in range(12)]
    (tmp_path / "pods.csv").write_text("\n".join(lines) + "\n")
    argv = ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"), "--bound", "--json"]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    extra = summary["extra"]
    assert 0 <= extra["bound_unallocated_gpu_pct_at_100"] <= summary["unallocated_gpu_pct_at_100"]
    assert extra["distance_to_bound_pct"] == pytest.approx(
        summary["unallocated_gpu_pct_at_100"] - extra["bound_unallocated_gpu_pct_at_100"], abs=1e-3
    )


def test_the_defragmentation_bound_keeps_the_pods_placed_before_the_first_failure(trace: Path) -> None:
    """``sim_bound --keep``'s pods on the slice of the real trace in the repo: ``prefix`` keeps
    exactly the pods ``default`` placed before its first failure (a real constraint there: pods
    fail before 100 % arrived), ``placed`` every pod it placed up to 100 %. (The bound with them
    kept takes a minute or more on the slice: the brute-force test above checks it.)"""
    nodes, pods = read_nodes(trace / NODES), read_pods(trace / PODS)
    seen: list[Attempt] = []
    replay(nodes, pods, Config("default", 42), seen.append)
    arrived = seen[: len(arrived_at_100(nodes, pods, 42, 1.3))]
    first_failure = next(a.seq for a in seen if a.node is None)
    assert first_failure < len(arrived)
    assert sim_bound.kept_pods(arrived, "prefix") == [a.pod for a in seen[:first_failure]]
    placed = sim_bound.kept_pods(arrived, "placed")
    assert placed == [a.pod for a in arrived if a.node is not None]
    assert len(placed) > first_failure
