"""How ``gpuledger health`` shows its reports: a node's cards with their stage and history, the
cluster's cards not serving in short, or JSON. The reports are built in
``gpuledger_common.card_history`` (from the node's inventory or the ledger); health.py fetches them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gpuledger_common.card_history import CardReport, Event, NodeReport, card_json
from gpuledger_common.render import ago, table


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at)) if at else "-"


def _since(at: float, now: float) -> str:
    return f"{when(at)} ({ago(at, now)} ago)" if at else "-"


def node_text(report: NodeReport, now: float, card: str = "") -> str:
    """The long form: every card of the node (or the one named), then each history not empty."""
    cards = [c for c in report.cards if _named(c, card)]
    rows = [[str(c.index), c.uuid, c.health, c.action or "-", c.stage, _since(c.since, now), c.reason] for c in cards]
    headers = ["CARD", "UUID", "HEALTH", "ACTION", "STAGE", "SINCE", "REASON"]
    lines = [f"node {report.node}: {_count(cards)}"]
    if report.problem:
        lines.append(f"(from the ledger: {report.problem}; no stage times or history)")
    lines.append(table(headers, rows) if rows else "no such card")
    for c in cards:
        if c.history:
            lines += ["", f"card {c.index} ({c.uuid}):", _history(c.history)]
    return "\n".join(lines)


def _named(c: CardReport, card: str) -> bool:
    return not card or card in (str(c.index), c.uuid)


def _history(events: Sequence[Event]) -> str:
    rows = [[when(e.at), e.what, e.reason, e.by or "-"] for e in events]
    return "\n".join("  " + line for line in table(["AT", "WHAT", "REASON", "BY"], rows).splitlines())


def cluster_text(reports: Sequence[NodeReport], now: float) -> str:
    """The short form: one line per card not serving, then the totals by stage."""
    cards = [c for r in reports for c in r.cards]
    out = [c for c in cards if not c.serving]
    rows = [[c.node, str(c.index), c.health, c.action or "-", c.stage, _since(c.since, now), c.reason] for c in out]
    lines = [table(["NODE", "CARD", "HEALTH", "ACTION", "STAGE", "SINCE", "REASON"], rows)] if rows else []
    lines += [f"{r.node}: from the ledger ({r.problem})" for r in reports if r.problem]
    lines.append(f"{len(reports)} node(s), {_count(cards)}")
    return "\n".join(lines)


def _count(cards: Sequence[CardReport]) -> str:
    stages = Counter("serving" if c.serving else c.stage for c in cards)
    parts = [f"{n} {stage}" for stage, n in sorted(stages.items(), key=lambda kv: (kv[0] != "serving", kv[0]))]
    return f"{len(cards)} card(s)" + (f": {', '.join(parts)}" if parts else "")


def to_json(reports: Sequence[NodeReport]) -> dict[str, Any]:
    cards = [c for r in reports for c in r.cards]
    totals = Counter("serving" if c.serving else c.stage for c in cards)
    nodes = [{"node": r.node, "problem": r.problem, "cards": [card_json(c) for c in r.cards]} for r in reports]
    return {"nodes": nodes, "totals": dict(sorted(totals.items()))}
