"""Policy x trace x seeds 42-51 through the trace replay, as a markdown table of medians beside the
FGD paper's published figures (unallocated GPU % at 100 % arrived, median of 10 seeds).

    PYTHONPATH=libs python benchmarks/sim_table.py [--data DIR] [--seeds 42-51] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from multiprocessing import Pool
from pathlib import Path

from gpuledger_sim.replay import Config, replay
from gpuledger_sim.trace import read_nodes, read_pods

# The trace lives in the shared folder beside the checkout; GPULEDGER_OPENB_DIR points elsewhere.
DATA = Path(os.environ.get("GPULEDGER_OPENB_DIR", Path(__file__).resolve().parents[1].parent / "shared/data/openb"))
POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "default")
TRACES = ("default", "gpushare40", "gpuspec33", "multigpu20")
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


def table(results: list[Result], seeds: list[int]) -> str:
    lines = [
        f"Unallocated GPU % when arrived GPU requests reach 100 % of capacity: median of seeds "
        f"{seeds[0]}-{seeds[-1]} (tune 1.3, 1,213 nodes / 6,212 GPUs). Paper: the FGD paper's "
        "published median; ratio = ours / paper.",
        "",
        "| trace | policy | ours | paper | ratio | frag/total % at 90 % | s per run |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for trace in TRACES:
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
            lines.append(
                f"| {trace} | {policy} | {ours:.2f} | {ref_s} | {ratio} | {frag:.2f} | {secs:.1f} |"
            )
    return "\n".join(lines) + "\n"


def seed_range(raw: str) -> list[int]:
    first, _, last = raw.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    seeds = seed_range(args.seeds)
    jobs = [
        (args.data, trace, policy, seed)
        for trace in args.traces.split(",")
        for policy in args.policies.split(",")
        for seed in seeds
    ]
    started = time.perf_counter()
    with Pool(min(args.workers, 2)) as pool:
        results = pool.map(one, jobs, chunksize=1)
    text = table(results, seeds)
    text += f"\n{len(jobs)} runs in {time.perf_counter() - started:.0f} s on 2 workers.\n"
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
