"""Card health: a pure state machine over events, with a record of every transition.

A card turns unhealthy at once on a critical XID (not in the ignored list), a double-bit ECC
error, an event NVML cannot attribute to a card (then every card), a lost card, a failed event
registration, or when NVML itself fails (every card). It turns healthy again only by

- an operator's explicit action (``set()``, reached over NATS), or
- a configured rule: ``nvml-returned`` (cards that were unhealthy only because NVML failed, once
  NVML answers again; on by default) and ``recover-after`` (hardware causes, after N quiet
  seconds; off by default).

Never silently: every transition is kept in ``log`` with who or what caused it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Health
from gpuledger_inventory.inventory import EventKind, GpuEvent

DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
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


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    recover_on_nvml_return: bool = True
    recover_after_s: float = 0.0  # 0: hardware causes need an operator


@dataclass(frozen=True, slots=True)
class CardHealth:
    health: Health = Health.HEALTHY
    cause: Cause = Cause.NONE
    reason: str = ""
    since: float = 0.0
    by: str = ""


@dataclass(frozen=True, slots=True)
class Transition:
    at: float
    uuid: CardUuid
    health: Health
    reason: str
    by: str  # the cause ("xid", "nvml", ...), "operator:<who>" or "rule:<name>"


@dataclass(slots=True)
class HealthBook:
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    cards: dict[CardUuid, CardHealth] = field(default_factory=dict)
    log: list[Transition] = field(default_factory=list)

    def of(self, uuid: CardUuid) -> CardHealth:
        return self.cards.get(uuid, CardHealth())

    # --- turning unhealthy ---------------------------------------------------------------------

    def _fail(self, uuid: CardUuid, cause: Cause, reason: str, now: float) -> list[Transition]:
        current = self.of(uuid)
        if current.health is Health.UNHEALTHY:
            if cause is not Cause.NVML and current.cause is Cause.NVML:
                self.cards[uuid] = replace(current, cause=cause, reason=reason, by=cause.value)
            return []
        self.cards[uuid] = CardHealth(Health.UNHEALTHY, cause, reason, now, cause.value)
        return [self._record(Transition(now, uuid, Health.UNHEALTHY, reason, cause.value))]

    def on_event(self, event: GpuEvent, cards: Iterable[CardUuid], now: float) -> list[Transition]:
        """Apply one health event; ``cards`` are all the node's cards (for unattributed events)."""
        cause, reason = self._judge(event)
        if cause is Cause.NONE:
            return []
        targets = [event.uuid] if event.uuid is not None else list(cards)
        return [t for uuid in targets for t in self._fail(uuid, cause, reason, now)]

    def _judge(self, event: GpuEvent) -> tuple[Cause, str]:
        where = f" on {event.mig_uuid}" if event.mig_uuid else ""
        if event.kind is EventKind.XID:
            if event.xid in self.policy.ignored_xids:
                return Cause.NONE, ""
            if event.uuid is None:
                return Cause.EVENT, f"XID {event.xid} on a card NVML could not name"
            return Cause.XID, f"XID {event.xid}{where}"
        if event.kind is EventKind.ECC_DOUBLE:
            return (Cause.ECC if event.uuid else Cause.EVENT), f"double-bit ECC error{where}"
        return Cause.NONE, ""

    def on_lost(self, uuid: CardUuid, now: float) -> list[Transition]:
        return self._fail(uuid, Cause.LOST, "GPU is lost (fell off the bus)", now)

    def on_registration_failed(self, uuid: CardUuid, problem: str, now: float) -> list[Transition]:
        return self._fail(uuid, Cause.REGISTRATION, problem, now)

    def on_nvml_down(self, cards: Iterable[CardUuid], error: str, now: float) -> list[Transition]:
        return [
            t for uuid in cards for t in self._fail(uuid, Cause.NVML, f"NVML failed: {error}", now)
        ]

    # --- turning healthy -----------------------------------------------------------------------

    def _heal(self, uuid: CardUuid, by: str, reason: str, now: float) -> list[Transition]:
        if self.of(uuid).health is Health.HEALTHY:
            return []
        self.cards[uuid] = CardHealth(Health.HEALTHY, Cause.NONE, "", now, by)
        return [self._record(Transition(now, uuid, Health.HEALTHY, reason, by))]

    def on_nvml_up(self, now: float) -> list[Transition]:
        """Rule ``nvml-returned``: heal the cards that were unhealthy only because NVML failed."""
        if not self.policy.recover_on_nvml_return:
            return []
        failed = [
            u
            for u, h in self.cards.items()
            if h.health is Health.UNHEALTHY and h.cause is Cause.NVML
        ]
        return [
            t
            for u in failed
            for t in self._heal(u, "rule:nvml-returned", "NVML answers again", now)
        ]

    def tick(self, now: float) -> list[Transition]:
        """Rule ``recover-after``: heal hardware causes after the configured quiet time."""
        after = self.policy.recover_after_s
        if after <= 0:
            return []
        hardware = (Cause.XID, Cause.ECC, Cause.EVENT)
        due = [u for u, h in self.cards.items() if h.cause in hardware and now - h.since >= after]
        reason = f"no new fault for {after:g}s"
        return [t for u in due for t in self._heal(u, "rule:recover-after", reason, now)]

    def set(
        self, uuid: CardUuid, healthy: bool, who: str, note: str, now: float
    ) -> list[Transition]:
        """An operator's explicit word, either way; the only way back from a hardware fault."""
        by = f"operator:{who or 'unknown'}"
        if healthy:
            return self._heal(uuid, by, note or "marked healthy by an operator", now)
        if self.of(uuid).health is Health.UNHEALTHY:
            return []
        reason = note or "marked unhealthy by an operator"
        self.cards[uuid] = CardHealth(Health.UNHEALTHY, Cause.OPERATOR, reason, now, by)
        return [self._record(Transition(now, uuid, Health.UNHEALTHY, reason, by))]

    def _record(self, transition: Transition) -> Transition:
        self.log.append(transition)
        del self.log[:-LOG_LIMIT]
        return transition

    # --- persistence ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "cards": {
                u: {**asdict(h), "health": h.health.value, "cause": h.cause.value}
                for u, h in self.cards.items()
            },
            "log": [transition_to(t) for t in self.log],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], policy: HealthPolicy) -> HealthBook:
        cards = {
            CardUuid(u): CardHealth(
                Health(h["health"]), Cause(h["cause"]), h["reason"], float(h["since"]), h["by"]
            )
            for u, h in raw.get("cards", {}).items()
        }
        log = [
            Transition(
                float(t["at"]), CardUuid(t["uuid"]), Health(t["health"]), t["reason"], t["by"]
            )
            for t in raw.get("log", [])
        ]
        return cls(policy, cards, log)


def transition_to(t: Transition) -> dict[str, Any]:
    return {"at": t.at, "uuid": t.uuid, "health": t.health.value, "reason": t.reason, "by": t.by}
