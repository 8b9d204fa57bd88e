"""Card remediation: a pure state machine per card, from a fault to back in service or retired.

    serving -> faulted                  (no new work; its holders stay; back only when healed)
    serving -> quarantined -> drained -> [resetting ->] checking -> serving
                                      \\-> retired   (a goal of retire, a failed reset or check)

A fault's *need* (the fault policy's ``Action``, faults.py) sets the card's goal: ``drain`` moves
its holders off and checks it, ``reset`` also resets it, ``retire`` takes it out once empty. A card
that faults again within ``retire_window_s`` of coming back is retired once drained, and so is one
whose reset fails, hangs or is not supported, or whose check fails. A retired card returns only by
an operator. Any heal of the card's health (an operator's word, or a rule) ends a remediation.

Only the card named by a fault moves: an event NVML could not attribute to one card and NVML's
own failure make a card take no new work, never drain it (they would drain the whole node).
The book knows nothing of NVML, the ledger or time beyond what it is told; ``docs/remediation.md``
tells the rules in words.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Remedy
from gpuledger_inventory.faults import Action, FaultPolicy
from gpuledger_inventory.health import CardHealth, Cause, implied_action

HISTORY_LIMIT = 20  # steps kept per card


_MANY = frozenset({Cause.EVENT, Cause.NVML})  # causes that fail every card of the node


class Stage(StrEnum):
    SERVING = "serving"
    FAULTED = "faulted"  # unhealthy: no new work, its holders stay
    QUARANTINED = "quarantined"  # its holders must move off
    DRAINED = "drained"  # no holder, no process: due for its reset or check
    RESETTING = "resetting"
    CHECKING = "checking"
    RETIRED = "retired"


REMEDY = {
    Stage.SERVING: Remedy.NONE,
    Stage.FAULTED: Remedy.NONE,
    Stage.QUARANTINED: Remedy.DRAIN,
    Stage.DRAINED: Remedy.RESET,
    Stage.RESETTING: Remedy.RESET,
    Stage.CHECKING: Remedy.RESET,
    Stage.RETIRED: Remedy.RETIRED,
}


# the stage a remedy found in the ledger resumes at (``RemediationBook.adopt``)
_ADOPTED = {Remedy.DRAIN: Stage.QUARANTINED, Remedy.RESET: Stage.DRAINED, Remedy.RETIRED: Stage.RETIRED}


class ResetOutcome(StrEnum):
    OK = "ok"
    FAILED = "failed"
    HUNG = "hung"  # cut off at the timeout
    UNSUPPORTED = "unsupported"


def resumed_goal(remedy: Remedy, reason: str, faults: FaultPolicy) -> Action:
    """What a card found in the ledger under ``remedy`` needs, from all the ledger keeps (the
    remedy and the health reason): the action of the XID its reason names where that fits the
    remedy (drain, or retire while draining), else a reset and check (the ledger does not say);
    a retired card stays retired."""
    if remedy is Remedy.RETIRED:
        return Action.RETIRE
    action = implied_action(Cause.XID, reason, faults) if reason.startswith("XID ") else Action.RESET
    if action is Action.DRAIN or (action is Action.RETIRE and remedy is Remedy.DRAIN):
        return action
    return Action.RESET


def need_of(health: CardHealth) -> Action:
    """What the card's current fault needs: the fault policy's action, at most no-new-work for a
    cause that fails every card (an event NVML could not attribute, NVML itself)."""
    if health.cause in _MANY:
        return Action.NO_NEW_WORK if health.action.severity >= Action.NO_NEW_WORK.severity else health.action
    return health.action


@dataclass(frozen=True, slots=True)
class RemediationPolicy:
    retire_window_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class Step:
    """One change of a card's stage; ``took_s`` is the time since the fault that began it."""

    at: float
    uuid: CardUuid
    stage: Stage
    reason: str
    took_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CardRemedy:
    stage: Stage = Stage.SERVING
    goal: Action = Action.APPLICATION  # what the current fault needs (drain, reset, retire)
    since: float = 0.0  # when it entered its stage
    fault_at: float = 0.0  # when the current episode began
    back_at: float | None = None  # when remediation last returned it to service
    history: tuple[Step, ...] = ()

    @property
    def remedy(self) -> Remedy:
        return REMEDY[self.stage]


@dataclass(slots=True)
class RemediationBook:
    policy: RemediationPolicy = field(default_factory=RemediationPolicy)
    cards: dict[CardUuid, CardRemedy] = field(default_factory=dict)

    def of(self, uuid: CardUuid) -> CardRemedy:
        return self.cards.get(uuid, CardRemedy())

    def in_stage(self, stage: Stage) -> list[CardUuid]:
        return [u for u, c in self.cards.items() if c.stage is stage]

    def _move(self, uuid: CardUuid, stage: Stage, reason: str, now: float, **changes: Any) -> list[Step]:
        card = replace(self.of(uuid), **changes)
        step = Step(now, uuid, stage, reason, max(0.0, now - card.fault_at))
        history = (*card.history, step)[-HISTORY_LIMIT:]
        self.cards[uuid] = replace(card, stage=stage, since=now, history=history)
        return [step]

    # --- a fault -------------------------------------------------------------------------------

    def on_fault(self, uuid: CardUuid, need: Action, reason: str, now: float) -> list[Step]:
        """The card's health book recorded a fault that needs ``need``."""
        card = self.of(uuid)
        if need is Action.APPLICATION or card.stage is Stage.RETIRED:
            return []
        if card.stage in (Stage.SERVING, Stage.FAULTED):
            return self._begin(uuid, card, need, reason, now)
        if card.stage is Stage.CHECKING:
            return self._retire(uuid, f"failed again while checked: {reason}", now)
        if card.stage is Stage.RESETTING or need.severity <= card.goal.severity:
            return []  # a reset brings its own events; a lesser need changes nothing
        return self._move(uuid, card.stage, f"{reason}: now needs {need.value}", now, goal=need)

    def _begin(self, uuid: CardUuid, card: CardRemedy, need: Action, reason: str, now: float) -> list[Step]:
        fresh = card.stage is Stage.SERVING
        fault_at = now if fresh else card.fault_at
        if need is Action.NO_NEW_WORK:
            return self._move(uuid, Stage.FAULTED, reason, now, goal=need, fault_at=fault_at) if fresh else []
        back = card.back_at
        if back is not None and now - back < self.policy.retire_window_s:
            need, reason = Action.RETIRE, f"{reason}, {now - back:.0f}s after it came back"
        return self._move(uuid, Stage.QUARANTINED, reason, now, goal=need, fault_at=fault_at)

    # --- drained, reset, checked ---------------------------------------------------------------

    def on_empty(self, uuid: CardUuid, now: float) -> list[Step]:
        """The card has no holder in the ledger and no process in NVML."""
        card = self.of(uuid)
        if card.stage is not Stage.QUARANTINED:
            return []
        steps = self._move(uuid, Stage.DRAINED, "no holder and no process", now)
        if card.goal is Action.RETIRE:
            steps += self._retire(uuid, "drained; its fault retires it", now)
        return steps

    def next_work(self, uuid: CardUuid) -> Stage | None:
        """A drained card's next stage: RESETTING or CHECKING (None: not drained)."""
        card = self.of(uuid)
        if card.stage is not Stage.DRAINED:
            return None
        return Stage.RESETTING if card.goal is Action.RESET else Stage.CHECKING

    def begin(self, uuid: CardUuid, now: float) -> list[Step]:
        """Start the drained card's reset (or, if it needs none, its check)."""
        stage = self.next_work(uuid)
        if stage is None:
            return []
        return self._move(uuid, stage, "reset started" if stage is Stage.RESETTING else "check started", now)

    def on_reset(self, uuid: CardUuid, outcome: ResetOutcome, detail: str, now: float) -> list[Step]:
        if self.of(uuid).stage is not Stage.RESETTING:
            return []
        if outcome is not ResetOutcome.OK:
            return self._retire(uuid, f"reset {outcome.value}{_detail(detail)}", now)
        return self._move(uuid, Stage.CHECKING, f"reset done{_detail(detail)}", now)

    def on_check(self, uuid: CardUuid, problems: tuple[str, ...], now: float) -> list[Step]:
        """The check's problems (none: it passed); a pass returns the card to service."""
        if self.of(uuid).stage is not Stage.CHECKING:
            return []
        if problems:
            return self._retire(uuid, f"check failed: {'; '.join(problems)}", now)
        return self._move(uuid, Stage.SERVING, "checked: back in service", now, back_at=now)

    def _retire(self, uuid: CardUuid, reason: str, now: float) -> list[Step]:
        return self._move(uuid, Stage.RETIRED, reason, now, goal=Action.RETIRE)

    # --- healed, or an operator's word ---------------------------------------------------------

    def on_healed(self, uuid: CardUuid, by: str, now: float) -> list[Step]:
        """The card's health turned healthy by ``by`` (an operator, a rule): any remediation ends."""
        card = self.of(uuid)
        if card.stage is Stage.SERVING:
            return []
        back = None if by.startswith("operator:") else card.back_at  # an operator vouches for it
        return self._move(uuid, Stage.SERVING, f"healed by {by}", now, back_at=back)

    def retire(self, uuid: CardUuid, who: str, note: str, now: float) -> list[Step]:
        """An operator retires the card: its holders move off first, then it stays out."""
        card = self.of(uuid)
        if card.stage is Stage.RETIRED:
            return []
        reason = f"retired by operator:{who}" + (f" ({note})" if note else "")
        if card.stage in (Stage.SERVING, Stage.FAULTED, Stage.QUARANTINED):
            fault_at = now if card.stage is Stage.SERVING else card.fault_at
            return self._move(uuid, Stage.QUARANTINED, reason, now, goal=Action.RETIRE, fault_at=fault_at)
        return self._retire(uuid, reason, now)

    def adopt(self, uuid: CardUuid, remedy: Remedy, goal: Action, reason: str, now: float) -> list[Step]:
        """After a restart without a saved book, the card's remedy as the node's ledger still shows
        it: ``drain`` is quarantined again (its holders still move off), ``reset`` is drained (its
        reset and check are done again), ``retired`` stays retired. A card the book already knows
        (a fault since the start) keeps its own account."""
        stage = _ADOPTED.get(remedy)
        if stage is None or uuid in self.cards:
            return []
        goal = Action.RETIRE if stage is Stage.RETIRED else goal
        why = f"resumed from the ledger's remedy {remedy.value} after a restart" + (f": {reason}" if reason else "")
        return self._move(uuid, stage, why, now, goal=goal, fault_at=now)

    def resume(self, now: float) -> list[Step]:
        """After a restart: a reset or check cut off by it is done again from drained."""
        cut = [u for u, c in self.cards.items() if c.stage in (Stage.RESETTING, Stage.CHECKING)]
        return [s for u in cut for s in self._move(u, Stage.DRAINED, "resumed after a restart", now)]

    # --- persistence ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {u: _card_to(c) for u, c in self.cards.items() if c.stage is not Stage.SERVING or c.history}

    @classmethod
    def from_json(cls, raw: dict[str, Any], policy: RemediationPolicy) -> RemediationBook:
        return cls(policy, {CardUuid(u): _card_from(CardUuid(u), c) for u, c in raw.items()})


def step_to(s: Step) -> dict[str, Any]:
    return {"at": s.at, "stage": s.stage.value, "reason": s.reason}


def _card_to(c: CardRemedy) -> dict[str, Any]:
    return {
        "stage": c.stage.value,
        "goal": c.goal.value,
        "since": c.since,
        "fault_at": c.fault_at,
        "back_at": c.back_at,
        "history": [step_to(s) for s in c.history],
    }


def _card_from(uuid: CardUuid, raw: dict[str, Any]) -> CardRemedy:
    history = tuple(Step(float(s["at"]), uuid, Stage(s["stage"]), str(s["reason"])) for s in raw.get("history", []))
    back = raw.get("back_at")
    return CardRemedy(
        Stage(raw["stage"]),
        Action(raw["goal"]),
        float(raw["since"]),
        float(raw["fault_at"]),
        None if back is None else float(back),
        history,
    )


def _detail(detail: str) -> str:
    return f" ({detail})" if detail else ""
