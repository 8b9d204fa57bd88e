"""The packing claims of docs/placement.md, on a slice of the real openb default trace kept in the repo.

The slice (tests/data/openb, see its README) is every 8th node of ``openb_node_list_gpu_node.csv``
and every 8th pod of ``openb_pod_list_default.csv``: 152 nodes / 770 GPUs, 1,019 pods, the trace's
mix at an eighth of its size. It replays with ``gpuledger sim``'s protocol (tune 1.3, the
unallocated GPU % when arrived requests reach 100 % of capacity) and, as benchmarks/sim_table.py
does on the whole trace, the figure of a policy is its median over seeds 42-51.

How the slice and seeds were chosen (measured at 6478217; median of seeds 42-51 [worst and best seed];
the time of the 30 replays on this project's 2-core machine):

    slice       default             fgd                 bestfit             30 replays
    every 4th   4.15 [4.08, 4.29]   5.66 [5.25, 7.33]   7.07 [6.34, 7.43]   17 s
    every 8th   3.98 [3.84, 4.16]   5.89 [4.84, 7.93]   7.55 [6.68, 7.79]   7 s (15 s beside a Go build)
    every 16th  3.91 [3.81, 4.46]   4.59 [4.31, 5.66]   6.00 [5.37, 7.70]   3 s
    every 32nd  4.72 [3.50, 4.88]   6.89 [4.57, 8.15]   6.30 [5.27, 8.78]   1.5 s

Every 8th is the smallest slice on which ``default`` beats ``fgd`` and ``bestfit`` on every seed
with room to spare: its worst seed (4.16) is below fgd's best (4.84). At every 16th, fgd is ahead
on one of seeds 42-61 and the medians are 0.7 points apart; at every 32nd, on two (and bestfit
ahead of default on one). The whole trace gives 4.15 / 4.80 / 7.16 (benchmarks/results/sim_table.md),
in the same order.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gpuledger_sim import check, cli
from gpuledger_sim.replay import Config, replay
from gpuledger_sim.trace import read_nodes, read_pods
from tests.unit.sim.conftest import NODES, PODS

pytestmark = pytest.mark.timeout(120)

SEEDS = range(42, 52)
# default's median on the slice, measured at 6478217 (exact: placement is deterministic per seed).
RECORDED_DEFAULT = 3.9765
# About the spread of default's seeds on the slice (3.84-4.16): a change of the policy that moves its
# median further has changed how it packs, and this figure and docs/placement.md need a new look.
TOLERANCE = 0.3


def median_unallocated(trace: Path, policy: str) -> float:
    nodes, pods = read_nodes(trace / NODES), read_pods(trace / PODS)
    figures = [replay(nodes, pods, Config(policy, seed, 1.3)).unallocated_gpu_pct_at_100 for seed in SEEDS]
    assert None not in figures, f"{policy}: some seed never reached 100 % arrived"
    return statistics.median(f for f in figures if f is not None)


def test_default_leaves_fewer_gpus_unallocated_than_fgd_and_bestfit(trace: Path) -> None:
    ours = median_unallocated(trace, "default")
    fgd, bestfit = median_unallocated(trace, "fgd"), median_unallocated(trace, "bestfit")
    assert ours < fgd and ours < bestfit, f"default {ours:.3f}, fgd {fgd:.3f}, bestfit {bestfit:.3f}"
    assert abs(ours - RECORDED_DEFAULT) <= TOLERANCE, f"default {ours:.3f}, recorded {RECORDED_DEFAULT}"


def test_the_replay_of_the_slice_passes_the_independent_check(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "placements.jsonl"
    argv = ["--nodes", str(trace / NODES), "--pods", str(trace / PODS), "--json", "--placements", str(out)]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert check.main([str(out), "--nodes", str(trace / NODES)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["unallocated_gpu_pct_at_100"] == summary["unallocated_gpu_pct_at_100"]
    assert summary["arrived_gpu_pct_final"] > 125
