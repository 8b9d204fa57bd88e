"""Policy x trace x seeds 42-51 through the trace replay, as a markdown table of medians beside the
FGD paper's published figures and the proven lower bound (unallocated GPU % at 100 % arrived,
median of 10 seeds; the bound's per-seed figures come from ``sim_bound.py``).

    python -m benchmarks.sim_table [--data DIR] [--seeds 42-51] [--out FILE] \
        [--runs benchmarks/results/sim_runs.jsonl] [--bounds benchmarks/results/sim_bound.jsonl]

Each run is appended to ``--runs`` as it ends and a run already there is not repeated (delete the
file after changing a policy); the table is made from that file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing import Pool
from pathlib import Path
from typing import TypeVar

from gpuledger_sim.replay import Config, replay
from gpuledger_sim.trace import read_nodes, read_pods

# The trace lives in the shared folder beside the checkout; GPULEDGER_OPENB_DIR points elsewhere.
DATA = Path(os.environ.get("GPULEDGER_OPENB_DIR", Path(__file__).resolve().parents[1].parent / "shared/data/openb"))
POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "default")
TRACES = ("default", "gpushare40", "gpuspec33", "multigpu20")
RESULTS = Path(__file__).resolve().parent / "results"
J = TypeVar("J")
# Published medians (Random, DotProd, GpuClustering, GpuPacking, BestFit, FGD) per trace.
PAPER: dict[str, tuple[float, ...]] = {
    "default": (13.75, 9.44, 8.42, 8.19, 7.09, 4.77),
    "gpushare40": (15.04, 10.66, 10.18, 10.19, 8.53, 6.05),
    "gpuspec33": (16.19, 20.17, 18.96, 17.67, 19.59, 12.12),
    "multigpu20": (13.16, 8.19, 6.62, 6.49, 6.27, 4.47),
}

Job = tuple[Path, str, str, int]
Result = tuple[str, str, int, float, float, float]


def one(job: Job) -> Result:
    data, trace, policy, seed = job
    nodes = read_nodes(data / "openb_node_list_gpu_node.csv")
    pods = read_pods(data / f"openb_pod_list_{trace}.csv")
    s = replay(nodes, pods, Config(policy, seed))
    at_100 = s.unallocated_gpu_pct_at_100
    frag = s.frag_total_pct_at_90
    return (
        trace,
        policy,
        seed,
        -1.0 if at_100 is None else at_100,
        -1.0 if frag is None else frag,
        s.runtime_s,
    )


def paper(trace: str, policy: str) -> float | None:
    figures = PAPER.get(trace)
    if figures is None or policy not in POLICIES[:6]:
        return None
    return figures[POLICIES.index(policy)]


def bounds_of(path: Path | None, seeds: list[int]) -> dict[str, dict[int, float]]:
    """Per trace, per seed: the proven lower bound (``sim_bound.py``'s lines)."""
    found: dict[str, dict[int, float]] = {}
    if path is None or not path.exists():
        return found
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["seed"] in seeds:
            found.setdefault(row["trace"], {})[row["seed"]] = row["bound_unallocated_gpu_pct_at_100"]
    return found


def table(results: list[Result], seeds: list[int], bounds: dict[str, dict[int, float]]) -> str:
    lines = [
        f"Unallocated GPU % when arrived GPU requests reach 100 % of capacity: median of seeds "
        f"{seeds[0]}-{seeds[-1]} (tune 1.3, 1,213 nodes / 6,212 GPUs). Paper: the FGD paper's "
        "published median; ratio = ours / paper. Bound: median of the per-seed proven lower bounds "
        "(no placement of the same arrived pods can do better); distance: median over seeds of "
        "ours - bound.",
        "",
        "| trace | policy | ours | paper | ratio | bound | distance | frag/total % at 90 % | s per run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for trace in TRACES:
        per_seed = bounds.get(trace, {})
        bound_s = f"{statistics.median(per_seed.values()):.2f}" if per_seed else ""
        if per_seed and len(per_seed) < len(seeds):
            bound_s += f" ({len(per_seed)} seeds)"
        for policy in POLICIES:
            rows = [r for r in results if r[0] == trace and r[1] == policy]
            if not rows:
                continue
            ours = statistics.median(r[3] for r in rows)
            frag = statistics.median(r[4] for r in rows)
            secs = statistics.median(r[5] for r in rows)
            ref = paper(trace, policy)
            ref_s = "" if ref is None else f"{ref:.2f}"
            ratio = "" if ref is None else f"{ours / ref:.2f}"
            gaps = [r[3] - per_seed[r[2]] for r in rows if r[2] in per_seed]
            gap_s = f"{statistics.median(gaps):.2f}" if gaps else ""
            lines.append(
                f"| {trace} | {policy} | {ours:.2f} | {ref_s} | {ratio} | {bound_s} | {gap_s} "
                f"| {frag:.2f} | {secs:.1f} |"
            )
    return "\n".join(lines) + "\n"


def done_runs(path: Path) -> list[Result]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r[0], r[1], int(r[2]), float(r[3]), float(r[4]), float(r[5])) for r in rows]


def seed_range(raw: str) -> list[int]:
    first, _, last = raw.partition("-")
    return list(range(int(first), int(last or first) + 1))


def rows_of(
    one: Callable[[J], dict[str, object]], jobs: Sequence[J], workers: int, out: Path | None
) -> list[dict[str, object]]:
    """``one`` of each job on up to two workers, in order, each row printed as a JSON line as it
    comes (and appended to ``out``, where named)."""
    rows = []
    with Pool(min(workers, 2)) as pool, contextlib.ExitStack() as stack:
        sink = stack.enter_context(out.open("a")) if out is not None else None
        for row in pool.imap(one, jobs):
            rows.append(row)
            for stream in (sys.stdout, sink):
                if stream is not None:
                    print(json.dumps(row), file=stream, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=Path, default=RESULTS / "sim_runs.jsonl")
    p.add_argument("--bounds", type=Path, default=RESULTS / "sim_bound.jsonl")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    seeds = seed_range(args.seeds)
    done = {(r[0], r[1], r[2]) for r in done_runs(args.runs)}
    jobs = [
        (args.data, trace, policy, seed)
        for trace in args.traces.split(",")
        for policy in args.policies.split(",")
        for seed in seeds
        if (trace, policy, seed) not in done
    ]
    started = time.perf_counter()
    with Pool(min(args.workers, 2)) as pool, args.runs.open("a") as sink:
        for result in pool.imap_unordered(one, jobs):
            print(json.dumps(result), file=sink, flush=True)
    wanted = set(args.traces.split(",")), set(args.policies.split(","))
    results = [r for r in done_runs(args.runs) if r[0] in wanted[0] and r[1] in wanted[1] and r[2] in seeds]
    text = table(results, seeds, bounds_of(args.bounds, seeds))
    text += (
        f"\n{len(results)} runs from {args.runs.name}, {len(jobs)} of them new "
        f"({time.perf_counter() - started:.0f} s on {min(args.workers, 2)} workers).\n"
    )
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
