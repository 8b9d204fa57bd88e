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
from collections import Counter
from pathlib import Path

from benchmarks.sim_table import DATA, RESULTS, bounds_of, seed_range
from gpuledger_sim.defrag import Budget
from gpuledger_sim.replay import Attempt, Config, replay
from gpuledger_sim.trace import WHOLE, read_nodes, read_pods

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
    keys = sorted({(str(r["trace"]), str(r["budget"]), int(str(r["nodes"]))) for r in rows},
                  key=lambda k: (k[0], k[1] != NONE, k[1], k[2]))  # fmt: skip
    for trace, budget, nodes in keys:
        runs = sorted((r for r in rows if (r["trace"], r["budget"], r["nodes"]) == (trace, budget, nodes)),
                      key=lambda r: int(str(r["seed"])))  # fmt: skip
        per_seed = bounds.get(trace, {})
        bound = f"{statistics.median(per_seed.values()):.2f}" if per_seed else ""

        def med(key: str, runs: list[dict[str, object]] = runs) -> float:
            return statistics.median(float(str(r.get(key, 0.0))) for r in runs)

        seeds_s = " ".join(f"{float(str(r['unallocated_gpu_pct_at_100'])):.3f}" for r in runs)
        shown = "—" if budget == NONE else str(nodes)
        lines.append(
            f"| {trace} | {budget} | {shown} | {med('unallocated_gpu_pct_at_100'):.3f} | {bound} "
            f"| {med('defrag_moves'):.0f} | {med('defrag_moves_per_1000_pods'):.2f} | {med('defrag_pods_let_in'):.0f} "
            f"| {med('defrag_pods_searched'):.0f} | {med('defrag_no_destination'):.0f} | {med('runtime_s'):.1f} "
            f"| {seeds_s} ({len(runs)} seeds) |"
        )
    return "\n".join(lines) + "\n"


def rooms_at_100(data: Path, trace: str, seed: int) -> dict[str, float]:
    """Without moves, at the 100 % point: the free GPU (% of capacity) in whole free cards, in rooms
    smaller than the smallest share any failed pod asked, and the rest; and how many placed pods
    ask no more than the largest room (only they could move anywhere)."""
    nodes = read_nodes(data / "openb_node_list_gpu_node.csv")
    capacity = sum(n.gpus for n in nodes) * WHOLE
    used: Counter[tuple[str, int]] = Counter()
    placed: list[int] = []
    failed: list[int] = []
    arrived = 0

    def seen(attempt: Attempt) -> None:
        nonlocal arrived
        if arrived >= capacity:
            return
        pod = attempt.pod
        arrived += pod.gpu_total
        per_card = min(pod.gpu_milli, WHOLE)
        if attempt.node is None:
            failed.extend([per_card] if pod.num_gpu else [])
            return
        for card in attempt.cards:
            used[(attempt.node, card)] += per_card
        placed.extend([per_card] if pod.num_gpu else [])

    replay(nodes, read_pods(data / f"openb_pod_list_{trace}.csv"), Config("default", seed), seen)
    rooms = [WHOLE - used[(n.name, i)] for n in nodes for i in range(n.gpus)]
    smallest = min(failed, default=WHOLE)
    largest = max((r for r in rooms if r < WHOLE), default=0)
    pct = 100 / capacity
    return {
        "idle": sum(r for r in rooms if r == WHOLE) * pct,
        "below": sum(r for r in rooms if r < min(smallest, WHOLE)) * pct,
        "rest": sum(r for r in rooms if smallest <= r < WHOLE) * pct,
        "smallest_failed": float(smallest),
        "largest_room": float(largest),
        "placed_fitting": float(sum(1 for share in placed if share <= largest)),
    }


def rooms_table(data: Path, traces: list[str], seeds: list[int]) -> str:
    lines = [
        f"Without moves, at 100 % arrived, median of seeds {seeds[0]}-{seeds[-1]}: where the free GPU is "
        "(% of capacity), the smallest share a failed pod asked (per-mille of a card), the largest room "
        "left on a card in use, and the placed pods asking no more than that room (the only ones that "
        "could move anywhere).",
        "",
        "| trace | idle cards | rooms below the smallest failed share | other rooms | smallest failed share "
        "| largest room on a used card | placed pods that fit it |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for trace in traces:
        runs = [rooms_at_100(data, trace, seed) for seed in seeds]

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        lines.append(
            f"| {trace} | {med('idle'):.2f} | {med('below'):.2f} | {med('rest'):.2f} | {med('smallest_failed'):.0f} "
            f"| {med('largest_room'):.0f} | {med('placed_fitting'):.0f} |"
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
    p.add_argument("--rooms", action="store_true", help="also decompose the free GPU at 100 %% without moves")
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
    if args.rooms:
        text += "\n" + rooms_table(args.data, traces, seeds)
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
