"""What the dominant-resource guard does in the trace replay: unallocated GPU % at 100 % arrived
and CPU-only pods refused, per trace and guard setting (median over the seeds).

    python -m benchmarks.sim_guard [--seeds 42-44] [--guards off,4000:32768,auto]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from multiprocessing import Pool
from pathlib import Path

from benchmarks.sim_table import DATA, seed_range
from gpuledger_sim.cli import parse_guard
from gpuledger_sim.replay import Config, replay
from gpuledger_sim.trace import read_nodes, read_pods

TRACES = ("default", "gpushare40", "gpuspec33", "multigpu20")

Job = tuple[Path, str, str, str, int]
Result = tuple[str, str, str, int, float, int]


def one(job: Job) -> Result:
    data, trace, policy, guard, seed = job
    nodes = read_nodes(data / "openb_node_list_gpu_node.csv")
    pods = read_pods(data / f"openb_pod_list_{trace}.csv")
    auto = guard == "auto"
    config = Config(policy, seed, 1.3, None if auto or guard == "off" else parse_guard(guard), auto)
    s = replay(nodes, pods, config)
    at_100 = -1.0 if s.unallocated_gpu_pct_at_100 is None else s.unallocated_gpu_pct_at_100
    return trace, policy, guard, seed, at_100, s.failed - s.failed_gpu_pods


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--seeds", default="42-44")
    p.add_argument("--policy", default="default")
    p.add_argument("--guards", default="off,4000:32768,auto")
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    seeds = seed_range(args.seeds)
    guards, traces = args.guards.split(","), args.traces.split(",")
    jobs = [(args.data, t, args.policy, g, s) for t in traces for g in guards for s in seeds]
    with Pool(min(args.workers, 2)) as pool:
        results = pool.map(one, jobs, chunksize=1)
    lines = [
        f"`{args.policy}`, seeds {args.seeds}: unallocated GPU % at 100 % arrived (median) and CPU-only "
        "pods the guard refused over the whole replay (median).",
        "",
        "| trace | guard | unallocated GPU % | CPU-only pods refused |",
        "|---|---|---:|---:|",
    ]
    for trace in traces:
        for guard in guards:
            rows = [r for r in results if r[0] == trace and r[2] == guard]
            pct = statistics.median(r[4] for r in rows)
            refused = statistics.median(r[5] for r in rows)
            lines.append(f"| {trace} | {guard} | {pct:.2f} | {refused:g} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
