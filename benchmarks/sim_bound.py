"""The proven lower bound on unallocated GPU % at 100 % arrived, per trace and seed, as JSON lines
that ``sim_table.py`` puts beside the policies (needs the 'bound' extra: highspy).

    python -m benchmarks.sim_bound [--seeds 42-51] [--traces ...] \
        [--out benchmarks/results/sim_bound.jsonl]

The column generation starts from the placements of two baseline replays (any feasible placement
serves; a good start only saves rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from multiprocessing import Pool
from pathlib import Path

from gpuledger_sim.bound import arrived_at_100, bound, start_from
from gpuledger_sim.replay import Attempt, Config, replay
from gpuledger_sim.trace import read_nodes, read_pods

DATA = Path(os.environ.get("GPULEDGER_OPENB_DIR", Path(__file__).resolve().parents[1].parent / "shared/data/openb"))
TRACES = ("default", "gpushare40", "gpuspec33", "multigpu20")
START_POLICIES = ("fgd", "bestfit")

Job = tuple[Path, str, int]


def one(job: Job) -> dict[str, object]:
    data, trace, seed = job
    nodes = read_nodes(data / "openb_node_list_gpu_node.csv")
    pods = read_pods(data / f"openb_pod_list_{trace}.csv")
    arrived = arrived_at_100(nodes, pods, seed, 1.3)
    start = []
    for policy in START_POLICIES:
        seen: list[Attempt] = []
        replay(nodes, pods, Config(policy, seed), seen.append)
        start += start_from(nodes, seen[: len(arrived)])
    found = bound(nodes, arrived, start=start)
    return {
        "trace": trace,
        "seed": seed,
        "bound_unallocated_gpu_pct_at_100": found.unallocated_pct,
        "lp_unallocated_gpu_pct": round(100 - 100 * found.lp_value / found.capacity, 3),
        "converged": found.converged,
        "rounds": found.rounds,
        "runtime_s": found.runtime_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last or first) + 1)
    jobs = [(args.data, trace, seed) for trace in args.traces.split(",") for seed in seeds]
    started = time.perf_counter()
    sink = args.out.open("a") if args.out else None
    with Pool(min(args.workers, 2)) as pool:
        for row in pool.imap(one, jobs):
            line = json.dumps(row)
            print(line, flush=True)
            if sink is not None:
                print(line, file=sink, flush=True)
    if sink is not None:
        sink.close()
    print(f"{len(jobs)} bounds in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
