"""The proven lower bound on unallocated GPU % at 100 % arrived, per trace and seed, as JSON lines
that ``sim_table.py`` puts beside the policies (needs the 'bound' extra: highspy).

    python -m benchmarks.sim_bound [--seeds 42-51] [--traces ...] \
        [--out benchmarks/results/sim_bound.jsonl]

The column generation starts from the placements of two baseline replays (any feasible placement
serves; a good start only saves rounds).

``--keep`` bounds what defragmentation can reach on top of ``default`` (docs/defragmentation.md):
the most GPU any placement allocates that still places the pods ``default`` placed, anywhere, with
any of the others. ``prefix``: the pods placed before its first failure (no defragmentation moves
before a pod fits nowhere, and none drops a placed pod, so every one of them stays placed whatever
it moves later); ``placed``: every pod it placed up to the 100 % point (the best rearrangement of
its placement when the figure is taken).

    python -m benchmarks.sim_bound --traces default --keep prefix,placed \
        --out benchmarks/results/sim_defrag_bound.jsonl
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.sim_table import DATA, rows_of, seed_range
from gpuledger_sim.bound import arrived_at_100, bound, start_from
from gpuledger_sim.replay import Attempt, Config, replay
from gpuledger_sim.trace import TracePod, read_nodes, read_pods

TRACES = ("default", "gpushare40", "gpuspec33", "multigpu20")
START_POLICIES = ("fgd", "bestfit")

KEEPS = ("none", "prefix", "placed")
KEPT_BY = "default"  # the policy whose placements --keep keeps

Job = tuple[Path, str, int, str]


def one(job: Job) -> dict[str, object]:
    data, trace, seed, keep = job
    nodes = read_nodes(data / "openb_node_list_gpu_node.csv")
    pods = read_pods(data / f"openb_pod_list_{trace}.csv")
    arrived = arrived_at_100(nodes, pods, seed, 1.3)
    start, kept = [], []
    for policy in START_POLICIES if keep == "none" else (KEPT_BY, *START_POLICIES):
        seen: list[Attempt] = []
        replay(nodes, pods, Config(policy, seed), seen.append)
        start += start_from(nodes, seen[: len(arrived)])
        if policy == KEPT_BY and keep != "none":
            kept = kept_pods(seen[: len(arrived)], keep)
    found = bound(nodes, arrived, start=start, keep=kept)
    row: dict[str, object] = {"trace": trace, "seed": seed}
    if keep != "none":
        row.update(keep=keep, kept_by=KEPT_BY, kept_pods=len(kept))
    return row | {
        "bound_unallocated_gpu_pct_at_100": found.unallocated_pct,
        "lp_unallocated_gpu_pct": round(100 - 100 * found.lp_value / found.capacity, 3),
        "converged": found.converged,
        "rounds": found.rounds,
        "runtime_s": found.runtime_s,
    }


def kept_pods(seen: list[Attempt], keep: str) -> list[TracePod]:
    """The pods ``keep`` says must stay placed, of a replay's attempts up to the 100 % point."""
    if keep == "prefix":
        failed = next((a.seq for a in seen if a.node is None), len(seen))
        seen = seen[:failed]
    return [a.pod for a in seen if a.node is not None]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--keep", default="none", help=f"comma-separated, of {', '.join(KEEPS)}")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    seeds = seed_range(args.seeds)
    keeps = args.keep.split(",")
    if unknown := [k for k in keeps if k not in KEEPS]:
        p.error(f"--keep: unknown {', '.join(unknown)} (known: {', '.join(KEEPS)})")
    jobs = [(args.data, trace, seed, keep) for trace in args.traces.split(",") for seed in seeds for keep in keeps]
    started = time.perf_counter()
    rows_of(one, jobs, args.workers, args.out)
    print(f"{len(jobs)} bounds in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
