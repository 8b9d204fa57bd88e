"""Human-readable tables for the CLI."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from gpuledger_common.mig_listing import mig_cell, slot_text
from gpuledger_core.model import Allocation, Card, CardShare
from gpuledger_core.status import CardStatus, Holder, NodeStatus


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def ago(since: float, now: float | None = None) -> str:
    seconds = max(0, int((now or time.time()) - since))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def holder(h: Holder) -> str:
    who = h.owner.describe().replace("pod ", "").replace("tool ", "tool:")
    if h.container:
        who += f"[{h.container}]"
    share = "whole card" if h.exclusive else f"{h.mem_mib} MiB, {h.core_milli / 10:g}%"
    return f"{who} ({share}{_used(h)}, {h.state.value}, {ago(h.since)})"


def _used(h: Holder) -> str:
    """What the holder's processes use of the card, where measured, and a mark when it is over its
    grant (docs/audit.md)."""
    if h.used_mib is None:
        return ""
    core = "" if h.used_core_milli is None else f" and {h.used_core_milli / 10:g}% of the SMs"
    return f", uses {h.used_mib} MiB{core}" + (" OVER GRANT" if h.over else "")


def cluster(nodes: Sequence[NodeStatus]) -> str:
    table_text = cards(nodes)
    if not table_text:
        return "no cards in the ledger"
    count = sum(len(n.cards) for n in nodes)
    used = sum(1 for n in nodes for c in n.cards if c.holders)
    return table_text + f"\n{len(nodes)} node(s), {count} card(s), {used} in use"


def cards(nodes: Sequence[NodeStatus], others: Mapping[str, int] | None = None) -> str:
    """One row per card (and per node whose ledger value cannot be read); "" when there is none.
    ``others``: per card UUID, how many of its holders were left out of ``nodes`` (a view of one
    namespace), said after the holders shown. A card in MIG mode lists its placements
    (``mig_listing``; in a namespace's view only those its holders hold)."""
    rows: list[list[str]] = []
    for node in nodes:
        if node.unreadable:  # nothing is placed there: its ledger value cannot be read
            rows.append([f"{node.name} (unreadable: {node.unreadable})", *["-"] * 7])
        for c in node.cards:
            shown = _holders(c, scoped=others is not None)
            hidden = (others or {}).get(c.card.uuid, 0)
            if hidden:
                shown.append(f"+{hidden} in other namespaces")
            rows.append(
                [
                    node.name + (" (stale)" if node.stale else ""),
                    str(c.card.index),
                    c.card.model,
                    f"{c.free_mem_mib}/{c.card.memory_mib}",
                    f"{c.free_core_milli / 10:g}%",
                    _health(c.card),
                    f"{c.foreign_processes} proc, {c.foreign_mib} MiB" if c.foreign_processes else "-",
                    "; ".join(shown) or "-",
                ]
            )
    if not rows:
        return ""
    headers = ["NODE", "CARD", "MODEL", "FREE MiB", "FREE CORE", "HEALTH", "FOREIGN", "HOLDERS"]
    return table(headers, rows)


def _holders(c: CardStatus, *, scoped: bool) -> list[str]:
    if c.card.mig:
        return [mig_cell(c, holder, only_held=scoped)]
    return [holder(h) for h in c.holders]


def allocation(a: Allocation) -> str:
    parts = []
    for g in a.grants:
        cards = ", ".join(f"card {s.index} {_share(s)}" for s in g.cards)
        parts.append(f"{g.container + ': ' if g.container else ''}{cards}")
    lease = (
        f", lease until {time.strftime('%H:%M:%S', time.localtime(a.lease_expires_at))}" if a.lease_expires_at else ""
    )
    return f"{a.id} {a.state.value} on {a.node} for {a.owner.describe()}: {'; '.join(parts)}{lease}"


def _share(s: CardShare) -> str:
    if s.mig is not None:
        return f"(MIG {slot_text(s.mig)}: {s.mem_mib} MiB, {s.core_milli / 10:g}%)"
    return "(whole)" if s.exclusive else f"({s.mem_mib} MiB, {s.core_milli / 10:g}%)"


def _health(card: Card) -> str:
    """A card's health, why, and its repair when one is under way
    (``unhealthy (XID 79: GPU has fallen off the bus) [drain]``)."""
    reason = f" ({card.health_reason})" if card.health_reason else ""
    remedy = f" [{card.remedy.value}]" if card.remedy else ""
    return card.health.value + reason + remedy
