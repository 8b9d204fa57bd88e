"""Card health: a pure state machine over events, with a record of every transition.

A card turns unhealthy at once on a fault whose action (``faults.py``: by XID from NVIDIA's
catalog, or by error class) is more than ``application``: an XID, a double-bit ECC error, an
event NVML cannot attribute to a card (then every card, at most ``no-new-work``), a lost card, a
failed event registration, or NVML itself failing (every card). ``CardHealth.action`` says what
the card needs (no new work, drain, reset, retire); a more severe fault on an unhealthy card
raises it, never lowers it. It turns healthy again only by

- an operator's explicit action (``set()``, reached over NATS), or
- a configured rule: ``nvml-returned`` (cards that were unhealthy only because NVML failed, once
  NVML answers again; on by default) and ``recover-after`` (hardware causes whose action is
  ``no-new-work``, after N quiet seconds; off by default: drain, reset and retire have their own
  way back, through remediation or an operator).

Never silently: every transition is kept in ``log`` with who or what caused it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Health
from gpuledger_inventory.faults import Action, FaultClass, FaultPolicy
from gpuledger_inventory.inventory import EventKind, GpuEvent

LOG_LIMIT = 50


class Cause(StrEnum):
    NONE = ""
    XID = "xid"
    ECC = "ecc"
    EVENT = "event"  # an event that names no card
    LOST = "lost"
    REGISTRATION = "registration"
    NVML = "nvml"
    OPERATOR = "operator"
    LEDGER = "ledger"  # found under repair in the node's ledger at a start without a saved book


NVML_FAILED = "NVML failed:"  # how the reason of a card unhealthy for NVML's own failure begins

# the class of the causes that are not XIDs (an old state file's card gets its action from it)
CAUSE_CLASSES = {
    Cause.ECC: FaultClass.ECC_UNCORRECTABLE,
    Cause.EVENT: FaultClass.UNATTRIBUTED,
    Cause.LOST: FaultClass.LOST,
    Cause.REGISTRATION: FaultClass.REGISTRATION,
    Cause.NVML: FaultClass.NVML,
    Cause.OPERATOR: FaultClass.OPERATOR,
}


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    faults: FaultPolicy = field(default_factory=FaultPolicy)
    recover_on_nvml_return: bool = True
    recover_after_s: float = 0.0  # 0: hardware causes need an operator


@dataclass(frozen=True, slots=True)
class CardHealth:
    health: Health = Health.HEALTHY
    cause: Cause = Cause.NONE
    reason: str = ""
    since: float = 0.0
    by: str = ""
    action: Action = Action.APPLICATION  # what the card needs; ``application`` while healthy

    def __post_init__(self) -> None:
        """An unhealthy card needs at least ``no-new-work``: made without an action, it gets
        the one its cause implies under the catalog."""
        if self.health is Health.UNHEALTHY and self.action is Action.APPLICATION:
            object.__setattr__(self, "action", implied_action(self.cause, self.reason, FaultPolicy()))


@dataclass(frozen=True, slots=True)
class Transition:
    at: float
    uuid: CardUuid
    health: Health
    reason: str
    by: str  # the cause ("xid", "nvml", ...), "operator:<who>" or "rule:<name>"
    action: Action = Action.APPLICATION  # the card's action after the transition


@dataclass(slots=True)
class HealthBook:
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    cards: dict[CardUuid, CardHealth] = field(default_factory=dict)
    log: list[Transition] = field(default_factory=list)

    def of(self, uuid: CardUuid) -> CardHealth:
        return self.cards.get(uuid, CardHealth())

    # --- turning unhealthy ---------------------------------------------------------------------

    def _fail(
        self, uuid: CardUuid, cause: Cause, reason: str, action: Action, now: float, by: str = ""
    ) -> list[Transition]:
        """Turn the card unhealthy, or raise an unhealthy card's action; a transition when
        either happens. A hardware cause replaces an NVML one (so nvml-returned leaves it)."""
        by = by or cause.value
        current = self.of(uuid)
        if current.health is Health.HEALTHY:
            self.cards[uuid] = CardHealth(Health.UNHEALTHY, cause, reason, now, by, action)
            return [self._record(Transition(now, uuid, Health.UNHEALTHY, reason, by, action))]
        if action.severity > current.action.severity:
            self.cards[uuid] = replace(current, cause=cause, reason=reason, by=by, action=action)
            return [self._record(Transition(now, uuid, Health.UNHEALTHY, reason, by, action))]
        if cause is not Cause.NVML and current.cause is Cause.NVML:
            self.cards[uuid] = replace(current, cause=cause, reason=reason, by=by)
        return []

    def on_event(self, event: GpuEvent, cards: Iterable[CardUuid], now: float) -> list[Transition]:
        """Apply one health event; ``cards`` are all the node's cards (for unattributed events)."""
        action, reason = self.policy.faults.action_for(event)
        if action is Action.APPLICATION:
            return []
        cause = _cause_of(event)
        targets = [event.uuid] if event.uuid is not None else list(cards)
        return [t for uuid in targets for t in self._fail(uuid, cause, reason, action, now)]

    def on_fault(self, uuid: CardUuid, fault: FaultClass, reason: str, now: float) -> list[Transition]:
        """A fault found other than by an event (row remapping read from NVML, a failed check)."""
        action = self.policy.faults.for_class(fault)
        if action is Action.APPLICATION:
            return []
        return self._fail(uuid, _cause_for(fault), reason, action, now)

    def on_lost(self, uuid: CardUuid, now: float) -> list[Transition]:
        action = self.policy.faults.for_class(FaultClass.LOST)
        return self._fail(uuid, Cause.LOST, "GPU is lost (fell off the bus)", action, now)

    def on_registration_failed(self, uuid: CardUuid, problem: str, now: float) -> list[Transition]:
        action = self.policy.faults.for_class(FaultClass.REGISTRATION)
        return self._fail(uuid, Cause.REGISTRATION, problem, action, now)

    def on_nvml_down(self, cards: Iterable[CardUuid], error: str, now: float) -> list[Transition]:
        action, reason = self.policy.faults.for_class(FaultClass.NVML), f"{NVML_FAILED} {error}"
        return [t for uuid in cards for t in self._fail(uuid, Cause.NVML, reason, action, now)]

    def on_resumed(self, uuid: CardUuid, reason: str, action: Action, now: float) -> list[Transition]:
        """The node's ledger shows the card under repair and no saved book says otherwise: it stays
        unhealthy (its remediation resumes; only that, or an operator, brings it back)."""
        return self._fail(uuid, Cause.LEDGER, reason or "under repair in the node's ledger", action, now)

    # --- turning healthy -----------------------------------------------------------------------

    def _heal(self, uuid: CardUuid, by: str, reason: str, now: float) -> list[Transition]:
        if self.of(uuid).health is Health.HEALTHY:
            return []
        self.cards[uuid] = CardHealth(Health.HEALTHY, Cause.NONE, "", now, by)
        return [self._record(Transition(now, uuid, Health.HEALTHY, reason, by))]

    def on_repaired(self, uuid: CardUuid, by: str, now: float) -> list[Transition]:
        """Rule ``remediation``: the card was drained, reset where it needed it, and passed its check."""
        return self._heal(uuid, by, "repaired and checked: back in service", now)

    def on_nvml_up(self, now: float) -> list[Transition]:
        """Rule ``nvml-returned``: heal the cards that were unhealthy only because NVML failed."""
        if not self.policy.recover_on_nvml_return:
            return []
        failed = [u for u, h in self.cards.items() if h.health is Health.UNHEALTHY and h.cause is Cause.NVML]
        return [t for u in failed for t in self._heal(u, "rule:nvml-returned", "NVML answers again", now)]

    def tick(self, now: float) -> list[Transition]:
        """Rule ``recover-after``: heal hardware causes after the configured quiet time, if all
        they need is ``no-new-work`` (drain, reset and retire have their own way back)."""
        after = self.policy.recover_after_s
        if after <= 0:
            return []
        due = [u for u, h in self.cards.items() if _passing(h) and now - h.since >= after]
        reason = f"no new fault for {after:g}s"
        return [t for u in due for t in self._heal(u, "rule:recover-after", reason, now)]

    def set(
        self,
        uuid: CardUuid,
        healthy: bool,
        who: str,
        note: str,
        now: float,
        action: Action | None = None,
    ) -> list[Transition]:
        """An operator's explicit word, either way; the only way back from a hardware fault.
        Unhealthy means ``action`` (``no-new-work`` if not given), raised on an unhealthy card."""
        by = f"operator:{who or 'unknown'}"
        if healthy:
            return self._heal(uuid, by, note or "marked healthy by an operator", now)
        action = action or self.policy.faults.for_class(FaultClass.OPERATOR)
        reason = note or "marked unhealthy by an operator"
        return self._fail(uuid, Cause.OPERATOR, reason, action.at_least(Action.NO_NEW_WORK), now, by)

    def _record(self, transition: Transition) -> Transition:
        self.log.append(transition)
        del self.log[:-LOG_LIMIT]
        return transition

    # --- persistence ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "cards": {
                u: {
                    **asdict(h),
                    "health": h.health.value,
                    "cause": h.cause.value,
                    "action": h.action.value,
                }
                for u, h in self.cards.items()
            },
            "log": [transition_to(t) for t in self.log],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], policy: HealthPolicy) -> HealthBook:
        """A saved book; a card saved before actions existed gets the one its cause implies
        now, a logged transition the one every fault had then (``no-new-work``)."""
        cards = {CardUuid(u): _card_from(h, policy.faults) for u, h in raw.get("cards", {}).items()}
        log = [_transition_from(t) for t in raw.get("log", [])]
        return cls(policy, cards, log)


def _cause_of(event: GpuEvent) -> Cause:
    if event.uuid is None:
        return Cause.EVENT
    return Cause.XID if event.kind is EventKind.XID else Cause.ECC


def _cause_for(fault: FaultClass) -> Cause:
    causes = {kind: cause for cause, kind in CAUSE_CLASSES.items()}
    return causes.get(fault, Cause.XID if fault is FaultClass.UNKNOWN_XID else Cause.ECC)


def _passing(h: CardHealth) -> bool:
    """A hardware fault that needs nothing but time (for rule recover-after)."""
    hardware = (Cause.XID, Cause.ECC, Cause.EVENT)
    return h.cause in hardware and h.action is Action.NO_NEW_WORK


def implied_action(cause: Cause, reason: str, faults: FaultPolicy) -> Action:
    """The action of an unhealthy card saved without one: its XID's (read from the reason,
    ``XID 79...``) or its cause's, at least ``no-new-work``."""
    if cause is Cause.XID:
        number = reason.removeprefix("XID ").split(" ")[0].split(":")[0]
        action = faults.for_xid(int(number))[0] if number.isdigit() else Action.NO_NEW_WORK
    elif cause in CAUSE_CLASSES:
        action = faults.for_class(CAUSE_CLASSES[cause])
    else:
        action = Action.NO_NEW_WORK
    return action.at_least(Action.NO_NEW_WORK)


def _card_from(h: dict[str, Any], faults: FaultPolicy) -> CardHealth:
    health, cause = Health(h["health"]), Cause(h["cause"])
    if "action" in h:
        action = Action(h["action"])
    elif health is Health.UNHEALTHY:
        action = implied_action(cause, h["reason"], faults)
    else:
        action = Action.APPLICATION
    return CardHealth(health, cause, h["reason"], float(h["since"]), h["by"], action)


def _transition_from(t: dict[str, Any]) -> Transition:
    health = Health(t["health"])
    old = Action.NO_NEW_WORK if health is Health.UNHEALTHY else Action.APPLICATION
    action = Action(t["action"]) if "action" in t else old
    return Transition(float(t["at"]), CardUuid(t["uuid"]), health, t["reason"], t["by"], action)


def transition_to(t: Transition) -> dict[str, Any]:
    return {
        "at": t.at,
        "uuid": t.uuid,
        "health": t.health.value,
        "reason": t.reason,
        "by": t.by,
        "action": t.action.value,
    }
