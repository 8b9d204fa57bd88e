"""``gpuledger sim``: replay a trace through a placement policy and report how well it packed; with
``--preemption``, replay it over time under each preemption strategy and report waits and evictions."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TextIO

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.packing import POLICIES, Guard
from gpuledger_sim.defrag import NODES_SEARCHED, Budget
from gpuledger_sim.dra import replay_dra
from gpuledger_sim.mig_replay import WAYS, replay_mig
from gpuledger_sim.moving import Moving
from gpuledger_sim.preempting import MOVING, STRATEGIES
from gpuledger_sim.replay import Attempt, Config, Summary, replay
from gpuledger_sim.timeline import run_timeline, subset
from gpuledger_sim.timeline_figures import over_time, rounds, table
from gpuledger_sim.trace import TraceNode, TracePod, read_nodes, read_pods, read_timed_pods

Replay = Callable[[Sequence[TraceNode], Sequence[TracePod], Config, Callable[[Attempt], None] | None], Summary]
PATHS: dict[str, Replay] = {"classic": replay, "dra": replay_dra}  # --path: how pods' cards are placed


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuledger sim",
        description="Replay a cluster trace (FGD simulator protocol) through a placement policy.",
    )
    p.add_argument("--nodes", type=Path, required=True, help="openb_node_list_*.csv")
    p.add_argument("--pods", type=Path, required=True, help="openb_pod_list_*.csv")
    p.add_argument("--policy", choices=POLICIES, default="default")
    p.add_argument(
        "--path",
        choices=tuple(PATHS),
        default="classic",
        help="classic: the placement engine over node states; dra: each pod's cards as a ResourceClaim "
        "allocated through DRA mode C's path (the ledger); default classic",
    )
    p.add_argument("--seed", type=int, default=42, help="shuffles arrival order (default 42)")
    p.add_argument(
        "--tune",
        type=float,
        default=1.3,
        help="append copies of trace pods until GPU requests reach this x capacity (default 1.3)",
    )
    p.add_argument(
        "--guard",
        metavar="CPU_MILLI:MEM_MIB|auto",
        help="keep this much CPU and memory free per free card from CPU-only pods, e.g. 4000:32768; "
        "'auto': what the trace's pods with cards ask per card",
    )
    p.add_argument(
        "--defrag",
        metavar="MOVES[:TOTAL]",
        help="for a pod that fits nowhere, move at most MOVES placed pods (and TOTAL over the replay) "
        "so that it fits, until arrived GPU reaches 100%% (docs/defragmentation.md); classic path only",
    )
    p.add_argument(
        "--defrag-nodes",
        type=int,
        help="with --defrag: the nodes searched to clear per pod, those lacking least for it (default 16)",
    )
    p.add_argument(
        "--mig",
        choices=WAYS,
        help="replay the GPU pods as MIG instances on A100 40 GB cards (docs/mig.md): a static all-balanced "
        "layout, on-demand first-fit, or gpuledger's choice",
    )
    p.add_argument("--placements", type=Path, help="write one JSON line per attempt to this file")
    p.add_argument(
        "--bound",
        action="store_true",
        help="also prove a lower bound on unallocated GPU %% at 100%% arrived (needs highspy: the 'bound' extra)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--preemption",
        metavar="STRATEGIES",
        help="replay over time instead (pods arrive at creation_time and run their duration; "
        "docs/preemption.md) under each of these comma-separated strategies: none, kube, ledger, "
        "ledger+defrag, defrag+ledger (docs/defragmentation.md); "
        "prints a markdown table (--tune and --guard do not apply)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="with --preemption: replay on a sample of the nodes (chosen by --seed) with at least "
        "this many GPUs; 0 (default): every node",
    )
    p.add_argument(
        "--moves-per-pod",
        type=int,
        help="with --preemption ledger+defrag or defrag+ledger: moves for one pod (default 2)",
    )
    p.add_argument(
        "--moves-per-hour",
        type=int,
        help="with --preemption ledger+defrag or defrag+ledger: moves in any hour replayed (default 10)",
    )
    p.add_argument(
        "--move-cooldown",
        type=float,
        metavar="SECONDS",
        help="with --preemption ledger+defrag or defrag+ledger: a moved pod stays for this long (default 3600)",
    )
    return p


def parse_guard(raw: str | None) -> Guard | None:
    if raw is None:
        return None
    cpu, sep, mem = raw.partition(":")
    try:
        return Guard(int(cpu), int(mem) if sep else 0)
    except ValueError:
        raise InvalidArgument("--guard", f"must be CPU_MILLI:MEM_MIB, got {raw!r}") from None


def parse_defrag(args: argparse.Namespace) -> Budget | None:
    if args.defrag is None:
        if args.defrag_nodes is not None:
            raise InvalidArgument("--defrag-nodes", "applies only with --defrag")
        return None
    if args.path != "classic":
        raise InvalidArgument("--defrag", f"moves pods on the classic path only, not --path {args.path}")
    if args.bound or args.placements is not None:
        raise InvalidArgument("--defrag", "the attempts do not record moves: no --bound or --placements with it")
    return Budget.parse(args.defrag, NODES_SEARCHED if args.defrag_nodes is None else args.defrag_nodes)


def placement_line(attempt: Attempt) -> str:
    pod = attempt.pod
    return json.dumps(
        {
            "seq": attempt.seq,
            "pod": pod.name,
            "cpu_milli": pod.cpu_milli,
            "memory_mib": pod.memory_mib,
            "num_gpu": pod.num_gpu,
            "gpu_milli": pod.gpu_milli,
            "gpu_spec": pod.gpu_spec,
            "node": attempt.node,
            "cards": list(attempt.cards),
        },
        separators=(",", ":"),
    )


def human(summary: Summary) -> str:
    s = summary
    return "\n".join(
        [
            f"{s.path} path, policy {s.policy}, seed {s.seed}, tune {s.tune}: {s.nodes} nodes, {s.gpus} GPUs",
            f"pods tried {s.pods}: placed {s.placed}, failed {s.failed} ({s.failed_gpu_pods} wanting GPUs)",
            f"unallocated GPU at 100% arrived: {_pct(s.unallocated_gpu_pct_at_100)}",
            f"fragmentation / capacity at 90% arrived: {_pct(s.frag_total_pct_at_90)}",
            f"at the end: arrived {s.arrived_gpu_pct_final:.2f}%, allocated "
            f"{s.allocated_gpu_pct_final:.2f}%, fragmentation {s.frag_total_pct_final:.2f}%",
            f"replayed in {s.runtime_s:.1f} s",
            *_defrag_lines(s),
            *_bound_lines(s),
        ]
    )


def _defrag_lines(s: Summary) -> list[str]:
    if "defrag_moves" not in s.extra:
        return []
    e = s.extra
    return [
        f"defragmentation to 100% arrived: {e['defrag_moves']:.0f} moves ({e['defrag_moves_per_1000_pods']:.2f} "
        f"per 1,000 pods) let {e['defrag_pods_let_in']:.0f} of {e['defrag_pods_searched']:.0f} pods in; "
        f"{e['defrag_no_destination']:.0f} had no card anywhere to move to; searched in {e['defrag_search_s']:.1f} s"
    ]


def _bound_lines(s: Summary) -> list[str]:
    if "bound_unallocated_gpu_pct_at_100" not in s.extra:
        return []
    proof = "converged" if s.extra["bound_converged"] else "not converged, still a valid bound"
    line = (
        f"lower bound on unallocated GPU at 100% arrived: {s.extra['bound_unallocated_gpu_pct_at_100']:.2f}% "
        f"({proof}, {s.extra['bound_runtime_s']:.0f} s)"
    )
    if "distance_to_bound_pct" in s.extra:
        line += f"; distance {s.extra['distance_to_bound_pct']:.2f} points"
    return [line]


def _writer(sink: TextIO) -> Callable[[Attempt], None]:
    def write(attempt: Attempt) -> None:
        print(placement_line(attempt), file=sink)

    return write


def _pct(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f}%"


def parse_moving(args: argparse.Namespace, strategies: Sequence[str]) -> Moving | None:
    given = {"--moves-per-pod": args.moves_per_pod, "--moves-per-hour": args.moves_per_hour,
             "--move-cooldown": args.move_cooldown}  # fmt: skip
    if not MOVING.keys() & set(strategies):
        for flag, value in given.items():
            if value is not None:
                raise InvalidArgument(
                    flag, f"applies only to the strategies that move pods: {', '.join(sorted(MOVING))}"
                )
        return None
    default = Moving()
    return Moving(
        default.per_pod if args.moves_per_pod is None else args.moves_per_pod,
        default.per_hour if args.moves_per_hour is None else args.moves_per_hour,
        default.cooldown_s if args.move_cooldown is None else args.move_cooldown,
    )


def run_preemption(args: argparse.Namespace, out: TextIO) -> int:
    strategies = [s.strip() for s in args.preemption.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise InvalidArgument(
            "--preemption", f"unknown strategy {unknown or args.preemption!r}; known: {', '.join(STRATEGIES)}"
        )
    if args.bound or args.placements is not None or args.path != "classic" or args.defrag is not None:
        raise InvalidArgument(
            "--preemption",
            "replays over time through the ledger alone: no --bound, --placements, --path or --defrag "
            "(the ledger+defrag strategy moves pods there)",
        )
    if args.gpus < 0:
        raise InvalidArgument("--gpus", f"must be 0 or more, got {args.gpus}")
    moving = parse_moving(args, strategies)
    nodes, pods = read_nodes(args.nodes), read_timed_pods(args.pods)
    if args.gpus:
        nodes = subset(nodes, args.gpus, args.seed)
    runs = [run_timeline(nodes, pods, strategy, args.policy, moving) for strategy in strategies]
    first = runs[0]
    print(f"{first.nodes} nodes, {first.gpus} GPUs, {first.pods} pods, policy {args.policy}", file=out)
    if args.json:
        print(json.dumps([asdict(f) for f in runs], indent=2), file=out)
        return 0
    for part in (table(runs), rounds(runs), over_time(runs)):
        print(part, file=out)
        print(file=out)
    return 0


def run(args: argparse.Namespace, out: TextIO) -> int:
    if args.mig is not None:
        found = replay_mig(read_nodes(args.nodes), read_pods(args.pods), args.mig, args.seed, args.tune)
        print(json.dumps(asdict(found), indent=2), file=out)
        return 0
    if args.preemption is not None:
        return run_preemption(args, out)
    if args.moves_per_pod is not None or args.moves_per_hour is not None or args.move_cooldown is not None:
        raise InvalidArgument(
            "--moves-per-pod", "the move budget applies only with --preemption ledger+defrag or defrag+ledger"
        )
    auto = args.guard == "auto"
    defrag = parse_defrag(args)
    config = Config(args.policy, args.seed, args.tune, None if auto else parse_guard(args.guard), auto, defrag)
    nodes, pods = read_nodes(args.nodes), read_pods(args.pods)
    seen: list[Attempt] = []
    replay_with = PATHS[args.path]
    if args.placements is None:
        summary = replay_with(nodes, pods, config, seen.append if args.bound else None)
    else:
        with args.placements.open("w") as sink:
            write = _writer(sink)

            def both(attempt: Attempt) -> None:
                write(attempt)
                if args.bound:
                    seen.append(attempt)

            summary = replay_with(nodes, pods, config, both)
    if args.bound:
        _add_bound(summary, nodes, pods, config, seen)
    print(json.dumps(asdict(summary), indent=2) if args.json else human(summary), file=out)
    return 0


def _add_bound(
    summary: Summary, nodes: list[TraceNode], pods: list[TracePod], config: Config, seen: list[Attempt]
) -> None:
    try:
        from gpuledger_sim.bound import arrived_at_100, bound, start_from
    except ImportError as err:
        raise InvalidArgument("--bound", f"needs highspy (pip install 'gpuledger[bound]'): {err}") from None
    arrived = arrived_at_100(nodes, pods, config.seed, config.tune)
    found = bound(nodes, arrived, start=start_from(nodes, seen[: len(arrived)]))
    summary.extra["bound_unallocated_gpu_pct_at_100"] = found.unallocated_pct
    summary.extra["bound_converged"] = float(found.converged)
    summary.extra["bound_runtime_s"] = found.runtime_s
    if summary.unallocated_gpu_pct_at_100 is not None:
        distance = summary.unallocated_gpu_pct_at_100 - found.unallocated_pct
        summary.extra["distance_to_bound_pct"] = round(distance, 3)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args, sys.stdout)
    except (InvalidArgument, OSError) as err:
        print(f"gpuledger sim: {err}", file=sys.stderr)
        return 2
