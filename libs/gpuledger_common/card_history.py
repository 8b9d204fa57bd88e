"""A card's health, remediation stage and history as its node's inventory tells them (the
``get`` request's message: ``extra.cards[].remediation`` and ``extra.health_log``), or, where the
inventory does not answer, as the ledger's listing shows them (health and remedy only).

Pure: what ``gpuledger health`` prints and what the dashboard's card history shows are built here
from the payloads; each fetches them itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpuledger_core.status import CardStatus, NodeStatus

# a remediation step's stage, as history names it (a check after a reset is the reset's end)
_STEP_NAMES = {"serving": "back", "checking": "checking", "resetting": "resetting"}
# the stage the ledger's remedy implies where the inventory does not answer
_REMEDY_STAGES = {"drain": "draining", "reset": "resetting", "retired": "retired"}


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a card's history: a health transition (fault, healthy) or a remediation step."""

    at: float
    what: str
    reason: str
    by: str = ""


@dataclass(frozen=True, slots=True)
class CardReport:
    node: str
    index: int
    uuid: str
    health: str
    reason: str
    action: str  # the fault policy's action for its current fault ("" when healthy or not known)
    by: str  # who or what set its health
    stage: str  # its remediation stage (serving, faulted, quarantined, ..., retired)
    since: float  # when it entered that stage (its health's time if it never left serving)
    remedy: str  # what the ledger is told: "", drain, reset, retired
    history: tuple[Event, ...] = ()
    source: str = "inventory"  # or "ledger" (the inventory did not answer: no stage time, no history)

    @property
    def serving(self) -> bool:
        return self.health == "healthy" and self.stage == "serving"


@dataclass(frozen=True, slots=True)
class NodeReport:
    node: str
    cards: tuple[CardReport, ...]
    problem: str = ""  # why the inventory's own account is missing ("" when it answered)


def from_inventory(message: Mapping[str, Any]) -> NodeReport:
    """A node's report from its inventory's message (``InventoryMessage``)."""
    node = message["node"]
    extra = message.get("extra") or {}
    remedies = {c["uuid"]: c.get("remedy", "") for c in node.get("cards", [])}
    log = extra.get("health_log") or []
    cards = tuple(_card(node["name"], c, remedies.get(c["uuid"], ""), log) for c in extra.get("cards", []))
    return NodeReport(node["name"], cards)


def _card(node: str, raw: Mapping[str, Any], remedy: str, log: Iterable[Mapping[str, Any]]) -> CardReport:
    health = raw.get("health") or {}
    remediation = raw.get("remediation") or {}
    stage = remediation.get("stage", "serving")
    since = remediation.get("since") or 0.0
    state = health.get("state", "healthy")
    if stage == "serving":  # unhealthy while serving: remediation is off, or has not begun
        stage, since = ("serving" if state == "healthy" else "faulted"), health.get("since", 0.0)
    faults = [_transition(t) for t in log if t.get("uuid") == raw["uuid"]]
    steps = [_step(s) for s in remediation.get("history", [])]
    return CardReport(
        node,
        raw["index"],
        raw["uuid"],
        state,
        health.get("reason", ""),
        _action(health),
        health.get("by", ""),
        stage,
        float(since),
        remedy,
        tuple(sorted(faults + steps, key=_order)),
    )


def _order(e: Event) -> tuple[float, int]:
    """In time; at the same time a fault before the steps it starts, a heal after them."""
    return e.at, {"fault": 0, "healthy": 2}.get(e.what, 1)


def _action(health: Mapping[str, Any]) -> str:
    return "" if health.get("state", "healthy") == "healthy" else str(health.get("action", ""))


def _transition(t: Mapping[str, Any]) -> Event:
    what = "fault" if t["health"] == "unhealthy" else "healthy"
    return Event(float(t["at"]), what, t.get("reason", ""), t.get("by", ""))


def _step(s: Mapping[str, Any]) -> Event:
    stage, reason = s["stage"], s.get("reason", "")
    what = "reset" if stage == "checking" and reason.startswith("reset done") else _STEP_NAMES.get(stage, stage)
    return Event(float(s["at"]), what, reason, _step_by(reason))


def _step_by(reason: str) -> str:
    """Who took a remediation step: the operator its reason names (a retire, a heal), else the rules."""
    _, found, rest = reason.partition("by operator:")
    return "operator:" + rest.split(" ")[0] if found else "rule:remediation"


def from_ledger(status: NodeStatus, problem: str) -> NodeReport:
    """A node's report from the ledger's listing: health, reason and remedy, no times or history."""
    return NodeReport(status.name, tuple(_ledger_card(status.name, c) for c in status.cards), problem)


def _ledger_card(node: str, c: CardStatus) -> CardReport:
    card, remedy = c.card, c.card.remedy.value
    stage = _REMEDY_STAGES.get(remedy) or ("serving" if card.healthy else "faulted")
    return CardReport(
        node, card.index, card.uuid, card.health.value, card.health_reason, "", "", stage, 0.0, remedy, source="ledger"
    )


def needs_inventory(status: NodeStatus) -> bool:
    """The ledger shows a card of the node not serving: its inventory has more to say."""
    return any(not c.card.healthy or c.card.remedy.value for c in status.cards)


def card_json(c: CardReport) -> dict[str, Any]:
    """A card's report as JSON: its fields, the history as a list of events."""
    return asdict(c) | {"history": [asdict(e) for e in c.history]}
