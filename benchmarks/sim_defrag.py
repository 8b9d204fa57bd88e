"""Defragmentation in the FGD replay (``gpuledger sim --defrag``; docs/defragmentation.md): unallocated
GPU % at 100 % arrived with and without moves, per trace and budget, over seeds, and the moves it took.

    python -m benchmarks.sim_defrag [--data DIR] [--traces default] [--seeds 42-44] \
        [--budgets none,1,2,4] [--nodes 16] [--runs benchmarks/results/sim_defrag_runs.jsonl] [--out FILE]

Budgets: ``none`` (no defragmentation, the same code) or ``MOVES[:TOTAL]`` as ``--defrag`` takes
them. One run at a time (the machine is shared); each run is appended to ``--runs`` as it ends and a
run already there is not repeated; the table is made from that file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.sim_table import DATA, RESULTS, bounds_of, seed_range
from gpuledger_sim.defrag import Budget
from gpuledger_sim.replay import Config, replay
from gpuledger_sim.trace import read_nodes, read_pods

NONE = "none"


def one(data: Path, trace: str, budget: str, nodes: int, seed: int) -> dict[str, object]:
    defrag = None if budget == NONE else Budget.parse(budget, nodes)  # nodes: 0 without moves
    s = replay(read_nodes(data / "openb_node_list_gpu_node.csv"), read_pods(data / f"openb_pod_list_{trace}.csv"),
               Config("default", seed, defrag=defrag))  # fmt: skip
    figures = {"unallocated_gpu_pct_at_100": s.unallocated_gpu_pct_at_100, "runtime_s": s.runtime_s, **s.extra}
    return {"trace": trace, "budget": budget, "nodes": nodes, "seed": seed, **figures}


def table(rows: list[dict[str, object]], seeds: list[int], bounds: dict[str, dict[int, float]]) -> str:
    lines = [
        f"Unallocated GPU % at 100 % arrived, policy `default`, tune 1.3: median of seeds {seeds[0]}-{seeds[-1]} "
        "(per seed in the last column). Moves: to the 100 % point, median per run and per 1,000 pods tried.",
        "",
        "| trace | budget (moves per pod[:total]) | nodes searched | unallocated GPU % | bound | moves | "
        "per 1,000 pods | pods let in | pods searched | no card to move to | s per run | per seed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    keys = sorted({(str(r["trace"]), str(r["budget"]), int(str(r["nodes"]))) for r in rows})
    for trace, budget, nodes in keys:
        runs = sorted((r for r in rows if (r["trace"], r["budget"], r["nodes"]) == (trace, budget, nodes)),
                      key=lambda r: int(str(r["seed"])))  # fmt: skip
        per_seed = bounds.get(trace, {})
        bound = f"{statistics.median(per_seed.values()):.2f}" if per_seed else ""

        def med(key: str, runs: list[dict[str, object]] = runs) -> float:
            return statistics.median(float(str(r.get(key, 0.0))) for r in runs)

        seeds_s = " ".join(f"{float(str(r['unallocated_gpu_pct_at_100'])):.2f}" for r in runs)
        shown = "—" if budget == NONE else str(nodes)
        lines.append(
            f"| {trace} | {budget} | {shown} | {med('unallocated_gpu_pct_at_100'):.2f} | {bound} "
            f"| {med('defrag_moves'):.0f} | {med('defrag_moves_per_1000_pods'):.2f} | {med('defrag_pods_let_in'):.0f} "
            f"| {med('defrag_pods_searched'):.0f} | {med('defrag_no_destination'):.0f} | {med('runtime_s'):.1f} "
            f"| {seeds_s} ({len(runs)} seeds) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--traces", default="default")
    p.add_argument("--seeds", default="42-44")
    p.add_argument("--budgets", default="none,1,2,4")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--runs", type=Path, default=RESULTS / "sim_defrag_runs.jsonl")
    p.add_argument("--bounds", type=Path, default=RESULTS / "sim_bound.jsonl")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    seeds, traces, budgets = seed_range(args.seeds), args.traces.split(","), args.budgets.split(",")
    for budget in budgets:  # refuse a bad budget before the first run
        if budget != NONE:
            Budget.parse(budget, args.nodes)
    rows = [json.loads(line) for line in args.runs.read_text().splitlines()] if args.runs.exists() else []
    done = {(r["trace"], r["budget"], r["nodes"], r["seed"]) for r in rows}
    with args.runs.open("a") as sink:
        for trace in traces:
            for budget in budgets:
                for seed in seeds:
                    nodes = 0 if budget == NONE else args.nodes  # no nodes searched without moves
                    if (trace, budget, nodes, seed) in done:
                        continue
                    row = one(args.data, trace, budget, nodes, seed)
                    print(json.dumps(row), file=sink, flush=True)
                    rows.append(row)
    wanted = [r for r in rows if r["trace"] in traces and r["budget"] in budgets and r["seed"] in seeds]
    wanted = [r for r in wanted if r["budget"] == NONE or r["nodes"] == args.nodes]
    text = table(wanted, seeds, bounds_of(args.bounds, seeds))
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
