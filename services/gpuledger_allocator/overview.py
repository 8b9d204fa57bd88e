"""The dashboard's aggregates: one row of totals per node, the cluster's totals and cards per model,
and a filtered page of the node rows (``GET /api/summary``), so that the first view of a large
fleet is a few kilobytes, not every card.

A node's row is made once per change of its status (its key's revision, its inventory's usage
report), its staleness and the fragmentation meter; the meter (the ``default`` policy's measure,
``gpuledger_core.fragmentation``) is rebuilt from the ledger's live allocations at most every
``METER_REFRESH_S``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuledger_allocator.view import ClusterView
from gpuledger_core.card_usage import Usage
from gpuledger_core.fragmentation import Fragmentation, ledger_meter, node_fragmentation
from gpuledger_core.ids import NodeName
from gpuledger_core.model import Remedy
from gpuledger_core.packing import NodeState, from_ledger
from gpuledger_core.packing.frag import FragMeter
from gpuledger_core.status import CardStatus, NodeStatus

METER_REFRESH_S = 30.0
WARM_PER_TURN = 250
DEFAULT_PAGE = 50
MAX_PAGE = 500
STATES = ("healthy", "unhealthy", "draining", "resetting", "retired")
NODE_STATES = (*STATES, "over-grant", "stale")
MODEL_FIELDS = ("cards", "memory_mib", "granted_mib", "idle", "not_healthy")
REPAIRS = {Remedy.DRAIN: "draining", Remedy.RESET: "resetting", Remedy.RETIRED: "retired"}


def card_state(card: CardStatus) -> str:
    """healthy, unhealthy (no new work; its holders stay) or its repair."""
    return REPAIRS.get(card.card.remedy, card.card.health.value)


@dataclass(frozen=True, slots=True)
class ModelCards:
    """A node's cards of one model: how many, memory, granted memory, nobody holds, not healthy."""

    model: str
    cards: int = 0
    memory_mib: int = 0
    granted_mib: int = 0
    idle: int = 0
    not_healthy: int = 0


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node's totals: capacity, what is granted, what is used (None: not reported) and who holds."""

    name: str
    models: tuple[str, ...] = ()
    cards: int = 0
    states: Mapping[str, int] = field(default_factory=dict)
    memory_mib: int = 0
    granted_mib: int = 0
    used_mib: int | None = None
    core_milli: int = 0
    granted_core_milli: int = 0
    holders: int = 0
    over: int = 0
    namespaces: frozenset[str] = frozenset()
    frag: Fragmentation = field(default_factory=Fragmentation)
    stale: bool = False
    unreadable: str = ""
    by_model: tuple[ModelCards, ...] = ()
    used_core_milli: int | None = None  # its processes' share of the cards' SM time; None: not sampled

    def has_state(self, state: str) -> bool:
        if state == "healthy":
            return self.cards > 0 and self.states.get("healthy", 0) == self.cards
        if state == "over-grant":
            return self.over > 0
        if state == "stale":
            return self.stale
        return self.states.get(state, 0) > 0


def node_row(status: NodeStatus, frag: Fragmentation, used: Mapping[str, Any] | None) -> NodeRow:
    """The row of a node's status; ``used``: its inventory's usage per card, if it reports one."""
    cards = status.cards
    holders = [h for c in cards for h in c.holders]
    return NodeRow(
        name=status.name,
        models=tuple(sorted({c.card.model for c in cards})),
        cards=len(cards),
        states=Counter(card_state(c) for c in cards),
        memory_mib=sum(c.card.memory_mib for c in cards),
        granted_mib=sum(c.card.memory_mib - c.free_mem_mib for c in cards),
        used_mib=None if used is None else sum(u.used_mib for c in cards if (u := used.get(c.card.uuid)) is not None),
        core_milli=1000 * len(cards),
        granted_core_milli=sum(1000 - c.free_core_milli for c in cards),
        holders=len({h.allocation_id for h in holders}),
        over=sum(1 for h in holders if h.over),
        namespaces=frozenset(h.owner.namespace for h in holders if h.owner.namespace),
        frag=frag,
        stale=status.stale,
        unreadable=status.unreadable,
        by_model=model_cards(cards),
        used_core_milli=sm_used(cards, used),
    )


def sm_used(cards: Iterable[CardStatus], used: Mapping[str, Any] | None) -> int | None:
    """The share of the cards' SM time their processes had in NVML's samples, per mille of a card,
    summed over the cards (each at most a whole card); None where the inventory samples none."""
    found: list[Usage] = [u for c in cards if used is not None and (u := used.get(c.card.uuid)) is not None]
    sampled = [[p.sm_percent for p in u.attributed if p.sm_percent is not None] for u in found if u.attributed]
    if not any(sampled):
        return None
    return sum(min(1000, 10 * sum(card)) for card in sampled)


@dataclass(frozen=True, slots=True)
class Filter:
    """What the node list shows: names containing ``text``, and each other field matched exactly."""

    text: str = ""
    model: str = ""
    namespace: str = ""
    state: str = ""

    def matches(self, row: NodeRow) -> bool:
        return (
            (not self.text or self.text in row.name)
            and (not self.model or self.model in row.models)
            and (not self.namespace or self.namespace in row.namespaces)
            and (not self.state or row.has_state(self.state))
        )


@dataclass(slots=True)
class Overview:
    """The node rows of one replica's view, each remade only when its node changed; a new meter
    remeasures each node's placement state as kept (memoised by the meter: cheap)."""

    view: ClusterView
    clock: Callable[[], float] = time.monotonic
    meter_refresh_s: float = METER_REFRESH_S
    _meter: FragMeter | None = None
    _meter_at: float = 0.0
    _rows: dict[NodeName, tuple[NodeStatus, NodeState, NodeRow]] = field(default_factory=dict)

    def meter(self) -> FragMeter:
        """The ``default`` policy's meter of the ledger's workload, remade every ``meter_refresh_s``
        (kept while the workload is the same, so nothing is remeasured)."""
        now = self.clock()
        if self._meter is None or now - self._meter_at >= self.meter_refresh_s:
            made = ledger_meter(self.view.ledgers.values())
            if self._meter is None or made.workload != self._meter.workload:
                self._meter = made
            self._meter_at = now
        return self._meter

    def row(self, name: NodeName) -> NodeRow | None:
        view = self.view
        if view.unreadable and name in view.unreadable:
            return NodeRow(name, stale=view.stale(name), unreadable=view.unreadable[name])
        status = view.status(name)  # the same value until the node's key or usage changes
        if status is None:
            self._rows.pop(name, None)
            return None
        meter, stale, known = self.meter(), view.stale(name), self._rows.get(name)
        if known is not None and known[0] is status:
            row = known[2]
            frag = node_fragmentation(meter, known[1])
            if row.stale == stale and row.frag == frag:
                return row
            made = replace(row, stale=stale, frag=frag)
            self._rows[name] = (status, known[1], made)
            return made
        state = from_ledger(view.ledgers[name])
        made = node_row(replace(status, stale=stale), node_fragmentation(meter, state), view.usage.get(name))
        self._rows[name] = (status, state, made)
        return made

    def names(self) -> list[NodeName]:
        """The nodes listed, by name (those whose value cannot be read too); rows of nodes gone
        are forgotten."""
        names = sorted(self.view.ledgers.keys() | self.view.unreadable.keys())
        if len(self._rows) > len(names):
            for gone in self._rows.keys() - set(names):
                del self._rows[gone]
        return names

    def rows(self) -> list[NodeRow]:
        """Every node's row, by name."""
        return [row for name in self.names() if (row := self.row(name)) is not None]

    async def warm(self, per_turn: int = WARM_PER_TURN) -> None:
        """Make every changed node's row, ``per_turn`` nodes per turn of the event loop (5,000 new
        nodes at once would stop it for over a second)."""
        for done, name in enumerate(self.names(), start=1):
            self.row(name)
            if done % per_turn == 0:
                await asyncio.sleep(0)


def totals(rows: Sequence[NodeRow]) -> NodeRow:
    """The rows added up: the cluster as one row (used is the sum of what is reported, None if
    no node reports it)."""
    states: Counter[str] = Counter()
    for row in rows:
        states.update(row.states)
    reported = [row.used_mib for row in rows if row.used_mib is not None]
    sampled = [row.used_core_milli for row in rows if row.used_core_milli is not None]
    return NodeRow(
        "",
        tuple(sorted({model for row in rows for model in row.models})),
        cards=sum(row.cards for row in rows),
        states=states,
        memory_mib=sum(row.memory_mib for row in rows),
        granted_mib=sum(row.granted_mib for row in rows),
        used_mib=sum(reported) if reported else None,
        core_milli=sum(row.core_milli for row in rows),
        granted_core_milli=sum(row.granted_core_milli for row in rows),
        holders=sum(row.holders for row in rows),
        over=sum(row.over for row in rows),
        namespaces=frozenset(ns for row in rows for ns in row.namespaces),
        frag=sum((row.frag for row in rows), Fragmentation()),
        stale=any(row.stale for row in rows),
        used_core_milli=sum(sampled) if sampled else None,
    )


def model_cards(cards: Iterable[CardStatus]) -> tuple[ModelCards, ...]:
    found: dict[str, ModelCards] = {}
    for c in cards:
        was = found.get(c.card.model) or ModelCards(c.card.model)
        found[c.card.model] = ModelCards(
            was.model,
            was.cards + 1,
            was.memory_mib + c.card.memory_mib,
            was.granted_mib + c.card.memory_mib - c.free_mem_mib,
            was.idle + (not c.holders and c.card.healthy),
            was.not_healthy + (not c.card.healthy),
        )
    return tuple(found.values())


def models_of(rows: Iterable[NodeRow]) -> list[dict[str, Any]]:
    """Cards per model: nodes, cards, memory, granted, cards nobody holds, cards not healthy."""
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        for m in row.by_model:
            entry = found.setdefault(m.model, dict.fromkeys(("nodes", *MODEL_FIELDS), 0))
            entry["nodes"] += 1
            for key in MODEL_FIELDS:
                entry[key] += getattr(m, key)
    return [{"model": model} | entry for model, entry in sorted(found.items())]


def row_json(row: NodeRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "models": list(row.models),
        "cards": row.cards,
        "states": dict(row.states),
        "memory_mib": row.memory_mib,
        "granted_mib": row.granted_mib,
        "used_mib": row.used_mib,
        "core_milli": row.core_milli,
        "granted_core_milli": row.granted_core_milli,
        "used_core_milli": row.used_core_milli,
        "holders": row.holders,
        "over": row.over,
        "namespaces": sorted(row.namespaces),
        "frag_milli": round(row.frag.milli, 1),
        "free_milli": row.frag.free_milli,
        "stale": row.stale,
        **({"unreadable": row.unreadable} if row.unreadable else {}),
    }


def summary(overview: Overview, where: Filter, page: int = 0, size: int = DEFAULT_PAGE) -> dict[str, Any]:
    """The cluster's totals and models, and page ``page`` (from 0) of the node rows ``where`` matches."""
    size = max(1, min(size, MAX_PAGE))
    rows = overview.rows()
    matched = [row for row in rows if where.matches(row)]
    whole = totals(rows)
    return {
        "totals": row_json(whole) | {"nodes": len(rows)},
        "models": models_of(rows),
        "namespaces": sorted(whole.namespaces),
        "matched": len(matched),
        "page": page,
        "size": size,
        "nodes": [row_json(row) for row in matched[page * size : (page + 1) * size]],
    }
