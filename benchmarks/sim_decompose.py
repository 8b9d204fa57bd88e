"""Where the unallocated GPU is at the 100 % arrived point: a policy's replay stopped there, its free
GPU sorted by why no failed pod took it, the failed pods' GPU by the models they name, and who
holds each model's cards. Medians over the seeds, in % of the cluster's GPU.

    python -m benchmarks.sim_decompose [--trace gpuspec33] [--seeds 42-51] [--no-supply] [--out FILE]

Free GPU on a node, against the GPU pods that failed up to then (nothing departs, so none of them
fits now): ``cpu/mem`` if the node's free CPU or memory fits none of them; ``model`` if some fit
it but none may use the node's card model; ``cards`` otherwise (its free cards are too few, or
too small, for those that could use it). Each split into ``idle`` (whole free cards) and ``part``
(room left on used cards). ``--no-supply`` builds ``default`` without the cluster's cards per
model, as the placement service does today (its scarcity term then counts nothing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from benchmarks.sim_table import DATA, seed_range
from gpuledger_core.packing import NodeChooser, NodeState, make_policy
from gpuledger_core.packing.state import flat_node
from gpuledger_sim.replay import Config, ask_of, commit, prepare, supply_of
from gpuledger_sim.trace import WHOLE, TracePod, read_nodes, read_pods

Figures = Counter[str]  # label -> milli of GPU


def at_100(data: Path, trace: str, policy: str, seed: int, supply: bool) -> Figures:
    """The replay up to the 100 % point, decomposed."""
    nodes, failed, held = replay_to_100(data, trace, policy, seed, supply)
    figures = free_by_cause(nodes, [p for p in failed if p.num_gpu])
    for pod in failed:
        figures[f"failed {pod.gpu_spec or 'any'}"] += pod.gpu_total
    for pod, at in held:
        model = nodes[at].cards[0].model
        kind = "any" if not pod.models else "only it" if pod.models == {model} else "it and others"
        figures[f"held {model} by {kind}"] += pod.gpu_total
    return figures


def replay_to_100(
    data: Path, trace: str, policy: str, seed: int, supply: bool
) -> tuple[list[NodeState], list[TracePod], list[tuple[TracePod, int]]]:
    """The replay's nodes when arrived GPU requests reach capacity, the pods that failed until
    then, and the pods placed (with their node's position)."""
    nodes = read_nodes(data / "openb_node_list_gpu_node.csv")
    setting = prepare(nodes, read_pods(data / f"openb_pod_list_{trace}.csv"), Config(policy, seed))
    states = [flat_node(n.name, n.model, n.gpus, n.cpu_milli, n.memory_mib) for n in setting.nodes]
    built = make_policy(policy, setting.typical, supply_of(setting.nodes) if supply else None)
    chooser = NodeChooser(states, built, None, setting.rng)
    failed: list[TracePod] = []
    held: list[tuple[TracePod, int]] = []
    arrived = 0
    for pod in setting.order:
        if arrived >= setting.capacity:
            break
        arrived += pod.gpu_total
        ask = ask_of(pod)
        found = chooser.choose(ask)
        if found is None:
            failed.append(pod)
            continue
        at, option = found
        chooser.update(at, commit(chooser.nodes[at], ask, option.cards))
        held.append((pod, at))
    return chooser.nodes, failed, held


def free_by_cause(nodes: Sequence[NodeState], failed: Sequence[TracePod]) -> Figures:
    figures: Figures = Counter()
    for node in nodes:
        idle = sum(WHOLE for card in node.cards if card.room == WHOLE)
        host = [p for p in failed if p.cpu_milli <= node.cpu_free and p.memory_mib <= node.mem_free]
        model = node.cards[0].model
        cause = "cpu/mem" if not host else "model" if all(p.models and model not in p.models for p in host) else "cards"
        figures[f"free {cause} idle"] += idle
        figures[f"free {cause} part"] += node.gpu_room - idle
        figures[f"free {model} {cause}"] += node.gpu_room
    return figures


def table(per_seed: list[Figures], capacity: int) -> str:
    labels = sorted({label for figures in per_seed for label in figures})
    lines = ["| where | % of GPU (median) |", "|---|---:|"]
    for label in labels:
        median = statistics.median(figures[label] for figures in per_seed)
        if median:
            lines.append(f"| {label} | {100 * median / capacity:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--trace", default="gpuspec33")
    p.add_argument("--policy", default="default")
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--no-supply", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    seeds = seed_range(args.seeds)
    per_seed = [at_100(args.data, args.trace, args.policy, seed, not args.no_supply) for seed in seeds]
    capacity = sum(n.gpus for n in read_nodes(args.data / "openb_node_list_gpu_node.csv")) * WHOLE
    supply = ", without the cards per model" if args.no_supply else ""
    text = f"{args.trace}, {args.policy}{supply}, seeds {args.seeds}, at 100 % arrived:\n\n" + table(per_seed, capacity)
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
