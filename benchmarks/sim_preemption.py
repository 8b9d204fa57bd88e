"""kube-scheduler-style preemption against the ledger's, over many node samples: the issue's target
(at least 30 % fewer evictions for the same or shorter high-priority wait) checked per sample, and the
median ratio over them (docs/preemption.md, "Measured on the traces").

    python -m benchmarks.sim_preemption [--traces default,gpushare40] [--gpus 32,48] \
        [--seeds 42-51] [--out benchmarks/results/sim_preemption_seeds.jsonl]

One replay per trace, size, node-sample seed and strategy (``gpuledger sim --preemption kube,ledger
--gpus N --seed S``); the replay is deterministic, so one run a row. Each sample's row: both
strategies' evictions and high-priority waits (p50, p99), the ledger's evictions over kube's, and
whether the target holds there (ratio at most 0.7, neither wait longer than kube's). The evictions
split into rounds (pods that preempted) and victims per round: the second is what the choice of
victims decides; the first is how often a high-priority pod found no room, which each strategy's
earlier choices change.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchmarks.sim_table import DATA, rows_of, seed_range
from gpuledger_sim.timeline import run_timeline, subset
from gpuledger_sim.timeline_figures import Figures
from gpuledger_sim.trace import read_nodes, read_timed_pods

TARGET = 0.7  # the ledger's evictions over kube's, at most

Job = tuple[Path, str, int, int]


def _wait(f: Figures, which: str) -> float:
    value = f.wait_p50 if which == "p50" else f.wait_p99
    return 0.0 if value is None else value


def one(job: Job) -> dict[str, object]:
    data, trace, gpus, seed = job
    nodes = subset(read_nodes(data / "openb_node_list_gpu_node.csv"), gpus, seed)
    pods = read_timed_pods(data / f"openb_pod_list_{trace}.csv")
    kube, ledger = (run_timeline(nodes, pods, strategy) for strategy in ("kube", "ledger"))
    ratio = ledger.evictions / kube.evictions if kube.evictions else None
    no_longer = all(_wait(ledger, w) <= _wait(kube, w) for w in ("p50", "p99"))
    return {
        "trace": trace,
        "gpus": gpus,
        "seed": seed,
        "nodes": len(nodes),
        "kube_evictions": kube.evictions,
        "ledger_evictions": ledger.evictions,
        "kube_wait_p50_s": _wait(kube, "p50"),
        "kube_wait_p99_s": _wait(kube, "p99"),
        "ledger_wait_p50_s": _wait(ledger, "p50"),
        "ledger_wait_p99_s": _wait(ledger, "p99"),
        "kube_rounds": kube.preemptions,
        "ledger_rounds": ledger.preemptions,
        "ratio": None if ratio is None else round(ratio, 3),
        "waits_no_longer": no_longer,
        "target_met": ratio is not None and ratio <= TARGET and no_longer,
        "runtime_s": round(kube.runtime_s + ledger.runtime_s, 1),
    }


def _num(row: dict[str, object], key: str) -> float:
    return float(str(row[key]))


def _per_round(rows: list[dict[str, object]], who: str) -> float:
    """Victims per preemption round, over all the rows' rounds."""
    rounds = sum(_num(r, f"{who}_rounds") for r in rows)
    return sum(_num(r, f"{who}_evictions") for r in rows) / rounds if rounds else 0.0


def summary(rows: list[dict[str, object]]) -> str:
    """Per trace and size: samples, where the target holds, the median ratio and where waits are no longer."""
    lines = [
        "| trace | GPUs | samples | target met | median ratio (ledger / kube evictions) | ratios | waits no longer "
        "| median ratio of rounds | victims per round, kube / ledger |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    groups = sorted({(str(r["trace"]), int(str(r["gpus"]))) for r in rows})
    for trace, gpus in groups:
        mine = [r for r in rows if r["trace"] == trace and r["gpus"] == gpus]
        ratios = [_num(r, "ratio") for r in mine if r["ratio"] is not None]
        median = f"{statistics.median(ratios):.2f}" if ratios else "-"
        listed = " ".join(f"{x:.2f}" for x in ratios)
        met = sum(bool(r["target_met"]) for r in mine)
        waits = sum(bool(r["waits_no_longer"]) for r in mine)
        rounds = [_num(r, "ledger_rounds") / _num(r, "kube_rounds") for r in mine if _num(r, "kube_rounds")]
        by_rounds = f"{statistics.median(rounds):.2f}" if rounds else "-"
        per = " / ".join(f"{_per_round(mine, who):.2f}" for who in ("kube", "ledger"))
        cells = (trace, gpus, len(mine), met, median, listed, waits, by_rounds, per)
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--traces", default="default,gpushare40")
    p.add_argument("--gpus", default="32,48")
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    sizes = [int(g) for g in args.gpus.split(",")]
    if any(g < 1 for g in sizes):
        p.error(f"--gpus: sizes must be 1 or more, got {args.gpus}")
    jobs = [(args.data, t, g, s) for t in args.traces.split(",") for g in sizes for s in seed_range(args.seeds)]
    started = time.perf_counter()
    print(summary(rows_of(one, jobs, args.workers, args.out)))
    print(f"{len(jobs)} samples in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
