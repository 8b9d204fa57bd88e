"""The openb traces as MIG, replayed with ``gpuledger sim --mig`` (``gpuledger_sim.mig_replay``):
a static mig-parted all-balanced layout served as NVIDIA's device plugin serves it, on-demand
first-fit, and gpuledger's choice; and the same pods' GPU requests as memory shares
(``gpuledger sim``, policy default, the same pods without GPU left out). Prints a Markdown table.

    python -m benchmarks.sim_mig [--seeds 42,43,44] [--traces default,gpushare40]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from gpuledger_sim.mig_replay import WAYS, replay_mig
from gpuledger_sim.replay import Attempt, Config, replay
from gpuledger_sim.trace import WHOLE, TraceNode, TracePod, read_nodes, read_pods

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb"


def _median(values: list[float | None]) -> str:
    found = [v for v in values if v is not None]
    return f"{statistics.median(found):.2f}" if found else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--seeds", default="42,43,44")
    parser.add_argument("--traces", default="default,gpushare40")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    nodes = read_nodes(args.data / "openb_node_list_gpu_node.csv")
    print(
        "| trace | way | requests served at 100 % | unused slices at 100 % | unallocated GPU at 100 % "
        "| instances made (reconfigurations) at 100 % | static instances |"
    )
    print("|---|---|---|---|---|---|---|")
    for trace in args.traces.split(","):
        pods = [p for p in read_pods(args.data / f"openb_pod_list_{trace}.csv") if p.num_gpu]
        for way in WAYS:
            runs = [replay_mig(nodes, pods, way, seed) for seed in seeds]
            print(
                f"| {trace} | MIG {way} | {_median([r.served_pct_at_100 for r in runs])} % "
                f"| {_median([r.unused_slices_pct_at_100 for r in runs])} % "
                f"| {_median([r.unallocated_gpu_pct_at_100 for r in runs])} % "
                f"| {_median([float(r.instances_made_at_100 or 0) for r in runs])} | {runs[0].static_instances} |",
                flush=True,
            )
        shares = [_shares(nodes, pods, seed) for seed in seeds]
        print(
            f"| {trace} | memory shares (default policy) | {_median([s[0] for s in shares])} % | n/a "
            f"| {_median([s[1] for s in shares])} % | 0 | 0 |",
            flush=True,
        )


def _shares(nodes: list[TraceNode], pods: list[TracePod], seed: int) -> tuple[float, float | None]:
    """Requests served (of those arrived) and unallocated GPU, at the 100 % point, as shares."""
    seen: list[Attempt] = []
    summary = replay(nodes, pods, Config("default", seed), seen.append)
    capacity, arrived, served, tried = sum(n.gpus for n in nodes) * WHOLE, 0, 0, 0
    for attempt in seen:
        tried += 1
        served += attempt.node is not None
        arrived += attempt.pod.gpu_total
        if arrived >= capacity:
            break
    return round(100 * served / tried, 3), summary.unallocated_gpu_pct_at_100


if __name__ == "__main__":
    main()
