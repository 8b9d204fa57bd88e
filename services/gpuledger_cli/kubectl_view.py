"""What ``kubectl gpuledger`` shows, from the cluster's status as the allocator serves it: the cards
that one namespace's holders hold (or every card, for all namespaces), drawn as ``gpuledger inspect``
draws them, and ``top``: per holder, what it was granted against what it uses, as far as the status
measures use (the share audit, docs/audit.md). Pure: no I/O.

A namespace's view shows each card that holds at least one of the namespace's pods (or claims), with
the card's free memory and compute over all of its holders and the others' holders as a count. Tools
outside Kubernetes have no namespace: only the view of all namespaces shows them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuledger_common import render
from gpuledger_common.mig_listing import slot_text
from gpuledger_core import codec_status
from gpuledger_core.model import OwnerKind
from gpuledger_core.status import CardStatus, Holder, NodeStatus

NOT_MEASURED = "n/m"
NOT_MEASURED_NOTE = (
    f"{NOT_MEASURED}: not measured. MEM USED is what a pod's processes use on the card, where the node's\n"
    "inventory tells each process's pod (docs/audit.md); tools' and DRA claims' use is not told apart.\n"
    "CORE USED is the pod's processes' share of the card's SM time in NVML's samples, where the driver\n"
    "samples processes (not on MIG cards). CARD PROCS: the compute processes NVML sees on the card;\n"
    "FOREIGN: the use there that no holder accounts for (whose, NVML cannot say)."
)
OUTSIDE = "(outside the ledger)"  # processes on a card nobody holds


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose holders to show: one namespace's, or every holder ("")."""

    namespace: str = ""

    @property
    def everything(self) -> bool:
        return not self.namespace

    def holds(self, h: Holder) -> bool:
        return self.everything or h.owner.namespace == self.namespace


@dataclass(frozen=True, slots=True)
class Scoped:
    """The nodes and cards in a scope, the holders outside it left out and counted per card UUID."""

    nodes: tuple[NodeStatus, ...]
    others: Mapping[str, int] = field(default_factory=dict)


def scoped(nodes: Sequence[NodeStatus], scope: Scope) -> Scoped:
    if scope.everything:
        return Scoped(tuple(nodes))
    kept: list[NodeStatus] = []
    others: dict[str, int] = {}
    for node in nodes:
        cards: list[CardStatus] = []
        for c in node.cards:
            mine = tuple(h for h in c.holders if scope.holds(h))
            if not mine:
                continue
            cards.append(replace(c, holders=mine))
            if len(mine) < len(c.holders):
                others[c.card.uuid] = len(c.holders) - len(mine)
        if cards or node.unreadable:  # an unreadable node may hold the namespace's pods: say so
            kept.append(replace(node, cards=tuple(cards)))
    return Scoped(tuple(kept), others)


def inspect_text(nodes: Sequence[NodeStatus], scope: Scope) -> str:
    """``gpuledger inspect``'s table, of the scope's cards, and a summary."""
    if scope.everything:
        return render.cluster(nodes)
    view = scoped(nodes, scope)
    table = render.cards(view.nodes, view.others)
    holders = sum(len(c.holders) for n in view.nodes for c in n.cards)
    cards = sum(len(n.cards) for n in view.nodes)
    where = sum(1 for n in view.nodes if n.cards)
    mine = f"namespace {scope.namespace}: {holders} holder(s) on {cards} card(s) of {where} node(s)"
    if not holders:
        mine = f"namespace {scope.namespace} holds no cards"
    in_use = sum(1 for n in nodes for c in n.cards if c.holders)
    total = sum(len(n.cards) for n in nodes)
    summary = f"{mine}; all namespaces: {len(nodes)} node(s), {total} card(s), {in_use} in use (-A shows them)"
    return f"{table}\n{summary}" if table else summary


def inspect_json(nodes: Sequence[NodeStatus], scope: Scope) -> dict[str, Any]:
    """``gpuledger inspect --json``'s shape, of the scope's cards; in a namespace's view each card also
    says how many of its holders are in other namespaces (``other_holders``)."""
    view = scoped(nodes, scope)
    found = []
    for node in view.nodes:
        encoded = codec_status.node_status_to(node)
        if not scope.everything:
            for card, status in zip(encoded["cards"], node.cards, strict=True):
                card["other_holders"] = view.others.get(status.card.uuid, 0)
        found.append(encoded)
    return {"namespace": scope.namespace or None, "nodes": found}


@dataclass(frozen=True, slots=True)
class Use:
    """What a holder uses of one card; None where it is not measured."""

    mem_mib: int | None = None
    core_milli: int | None = None


@dataclass(frozen=True, slots=True)
class TopRow:
    """One holder on one card: granted against used. ``granted_*`` are None for processes that no
    holder accounts for (``OUTSIDE``)."""

    namespace: str
    kind: str
    holder: str
    container: str
    node: str
    card: int
    card_uuid: str
    model: str
    granted_mib: int | None
    granted_core_milli: int | None
    whole: bool
    used: Use
    over: bool  # using more memory than granted (docs/audit.md)
    card_processes: int
    card_foreign_processes: int
    card_foreign_mib: int
    mig: str = ""  # the MIG placement held (``1g.10gb@6``); "" for a share or a whole card


def used_by(holder: Holder) -> Use:
    """What the cluster's status says ``holder`` uses of its card (the share audit; None where not
    measured): the memory its pod's processes use, and their share of the card's SM time."""
    return Use(mem_mib=holder.used_mib, core_milli=holder.used_core_milli)


def top_rows(nodes: Sequence[NodeStatus], scope: Scope) -> list[TopRow]:
    rows: list[TopRow] = []
    for node in nodes:
        for c in node.cards:
            rows += [_holder_row(node, c, h) for h in c.holders if scope.holds(h)]
            if scope.everything and not c.holders and c.processes:
                rows.append(_outside_row(node, c))
    return sorted(rows, key=lambda r: (r.namespace, r.holder, r.container, r.node, r.card))


def _holder_row(node: NodeStatus, c: CardStatus, h: Holder) -> TopRow:
    return TopRow(
        h.owner.namespace, h.owner.kind.value, _name(h), h.container, node.name, c.card.index, c.card.uuid,
        c.card.model, h.mem_mib, h.core_milli, h.exclusive, used_by(h), h.over, c.processes,
        c.foreign_processes, c.foreign_mib, slot_text(h.mig) if h.mig is not None else "",
    )  # fmt: skip


def _outside_row(node: NodeStatus, c: CardStatus) -> TopRow:
    """Processes on a card nobody holds: all they use is foreign, and measured."""
    return TopRow(
        "", "outside", OUTSIDE, "", node.name, c.card.index, c.card.uuid, c.card.model,
        None, None, False, Use(mem_mib=c.foreign_mib), False, c.processes, c.foreign_processes, c.foreign_mib,
    )  # fmt: skip


def _name(h: Holder) -> str:
    if h.owner.kind is OwnerKind.POD:
        return h.owner.name or h.owner.id
    if h.owner.kind is OwnerKind.CLAIM:
        return f"claim/{h.owner.name or h.owner.id}"
    return f"tool:{h.owner.id}"


def top_text(rows: Sequence[TopRow], scope: Scope) -> str:
    if not rows:
        return "no holders in the ledger" if scope.everything else f"namespace {scope.namespace} holds no cards"
    headers = ["NAMESPACE", "HOLDER", "CONTAINER", "NODE", "CARD", "MEM GRANTED", "MEM USED"]
    headers += ["CORE GRANTED", "CORE USED", "CARD PROCS", "FOREIGN"]
    table = render.table(headers, [_top_cells(r) for r in rows])
    unmeasured = any(r.used.mem_mib is None or r.used.core_milli is None for r in rows)
    return f"{table}\n\n{NOT_MEASURED_NOTE}" if unmeasured else table


def _top_cells(r: TopRow) -> list[str]:
    whole = " (whole)" if r.whole else ""
    placed = f" (MIG {r.mig})" if r.mig else whole
    return [
        r.namespace or "-",
        r.holder,
        r.container or "-",
        r.node,
        str(r.card),
        "-" if r.granted_mib is None else f"{r.granted_mib} MiB{placed}",
        NOT_MEASURED if r.used.mem_mib is None else f"{r.used.mem_mib} MiB" + (" OVER GRANT" if r.over else ""),
        "-" if r.granted_core_milli is None else f"{r.granted_core_milli / 10:g}%{whole}",
        NOT_MEASURED if r.used.core_milli is None else f"{r.used.core_milli / 10:g}%",
        str(r.card_processes),
        f"{r.card_foreign_processes} proc, {r.card_foreign_mib} MiB" if r.card_foreign_processes else "-",
    ]


def top_json(rows: Sequence[TopRow], scope: Scope) -> dict[str, Any]:
    """Each row with ``used`` values null where not measured (they fill in, in the same place, once
    the status carries them)."""
    return {
        "namespace": scope.namespace or None,
        "holders": [
            {
                "namespace": r.namespace or None,
                "kind": r.kind,
                "holder": r.holder,
                "container": r.container,
                "node": r.node,
                "card": r.card,
                "card_uuid": r.card_uuid,
                "model": r.model,
                "granted": {"mem_mib": r.granted_mib, "core_milli": r.granted_core_milli, "whole": r.whole}
                | ({"mig": r.mig} if r.mig else {}),
                "used": {"mem_mib": r.used.mem_mib, "core_milli": r.used.core_milli},
                "over": r.over,
                "card_processes": r.card_processes,
                "card_foreign": {"processes": r.card_foreign_processes, "mem_mib": r.card_foreign_mib},
            }
            for r in rows
        ],
    }
