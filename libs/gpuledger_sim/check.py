"""An independent check of a replay's placements file.

It shares no code with the replay: it reads the node CSV and the placements (one JSON object per
attempt, in arrival order), verifies that no node's CPU or memory and no card is ever over
capacity, that every placement names distinct existing cards of an allowed model, and recomputes
the headline figure (unallocated GPU % when arrived GPU requests first reach 100 % of capacity).

    python -m gpuledger_sim.check placements.jsonl --nodes openb_node_list_gpu_node.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WHOLE = 1000


@dataclass(slots=True)
class _Node:
    cpu: int
    mem: int
    model: str
    cards: list[int]  # milli used per card


@dataclass(slots=True)
class Report:
    attempts: int = 0
    placed: int = 0
    capacity_milli: int = 0
    unallocated_gpu_pct_at_100: float | None = None
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "placed": self.placed,
            "unallocated_gpu_pct_at_100": self.unallocated_gpu_pct_at_100,
            "violation_count": len(self.violations),
            "violations": self.violations[:20],
        }


def load_nodes(path: Path) -> dict[str, _Node]:
    with path.open(newline="") as handle:
        return {
            row["sn"]: _Node(
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                row.get("model") or "",
                [0] * int(row["gpu"]),
            )
            for row in csv.DictReader(handle)
        }


def check(lines: list[str], nodes: dict[str, _Node]) -> Report:
    report = Report(capacity_milli=WHOLE * sum(len(n.cards) for n in nodes.values()))
    arrived = allocated = 0
    for number, line in enumerate(lines):
        entry = json.loads(line)
        report.attempts += 1
        if entry["seq"] != number:
            report.violations.append(f"line {number + 1}: seq {entry['seq']}, expected {number}")
        gpu = entry["num_gpu"] * entry["gpu_milli"]
        arrived += gpu
        if entry["node"] is not None:
            problem = _apply(entry, nodes)
            if problem:
                report.violations.append(f"line {number + 1} ({entry['pod']}): {problem}")
            report.placed += 1
            allocated += gpu
        if report.unallocated_gpu_pct_at_100 is None and arrived >= report.capacity_milli:
            pct = 100 - 100 * allocated / report.capacity_milli
            report.unallocated_gpu_pct_at_100 = round(pct, 3)
    return report


def _apply(entry: dict[str, Any], nodes: dict[str, _Node]) -> str:
    node = nodes.get(entry["node"])
    if node is None:
        return f"unknown node {entry['node']}"
    cards = entry["cards"]
    if len(cards) != entry["num_gpu"] or len(set(cards)) != len(cards):
        return f"cards {cards} for {entry['num_gpu']} GPU(s)"
    if any(not 0 <= c < len(node.cards) for c in cards):
        return f"cards {cards} not all on a node of {len(node.cards)} cards"
    spec = [m for m in (entry.get("gpu_spec") or "").split("|") if m]
    if cards and spec and node.model not in spec:
        return f"model {node.model} not in {entry['gpu_spec']}"
    node.cpu -= entry["cpu_milli"]
    node.mem -= entry["memory_mib"]
    for c in cards:
        node.cards[c] += entry["gpu_milli"]
    if node.cpu < 0 or node.mem < 0:
        return f"node {entry['node']} over capacity (cpu left {node.cpu}m, memory {node.mem} MiB)"
    over = [c for c in cards if node.cards[c] > WHOLE]
    return f"card(s) {over} of {entry['node']} over capacity" if over else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuledger_sim.check", description=__doc__)
    p.add_argument("placements", type=Path)
    p.add_argument("--nodes", type=Path, required=True)
    args = p.parse_args(argv)
    report = check(args.placements.read_text().splitlines(), load_nodes(args.nodes))
    print(json.dumps(report.as_dict(), indent=2))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
