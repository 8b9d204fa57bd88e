"""Remediation: each card's way from a fault to back in service, or to retired (a table of scenarios)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import cast

import pytest

from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Card, Health, Node, Remedy
from gpuledger_inventory.faults import Action, FaultPolicy
from gpuledger_inventory.health import CardHealth, Cause, HealthBook, HealthPolicy, Transition
from gpuledger_inventory.inventory import CardInfo
from gpuledger_inventory.remediation import (
    HISTORY_LIMIT,
    RemediationBook,
    RemediationPolicy,
    ResetOutcome,
    Stage,
    Step,
    need_of,
    resumed_goal,
)
from gpuledger_inventory.remediator import Remediator
from gpuledger_inventory.repair import Checker, Resetter
from gpuledger_inventory.state import NodeState

pytestmark = pytest.mark.timeout(5)

A, B = CardUuid("GPU-a"), CardUuid("GPU-b")
Input = Callable[[RemediationBook, float], object]


def fault(need: Action, uuid: CardUuid = A) -> Input:
    return lambda book, now: book.on_fault(uuid, need, f"XID for {need.value}", now)


def empty(book: RemediationBook, now: float) -> object:
    return book.on_empty(A, now)


def begin(book: RemediationBook, now: float) -> object:
    return book.begin(A, now)


def reset(outcome: ResetOutcome) -> Input:
    return lambda book, now: book.on_reset(A, outcome, "", now)


def check(*problems: str) -> Input:
    return lambda book, now: book.on_check(A, problems, now)


def healed(by: str) -> Input:
    return lambda book, now: book.on_healed(A, by, now)


def retire(book: RemediationBook, now: float) -> object:
    return book.retire(A, "ops", "", now)


def resume(book: RemediationBook, now: float) -> object:
    return book.resume(now)


RESET_AND_BACK = [fault(Action.RESET), empty, begin, reset(ResetOutcome.OK), check()]

SCENARIOS: dict[str, tuple[list[Input], list[Stage]]] = {
    "an application's fault leaves the card alone": ([fault(Action.APPLICATION)], []),
    "no new work: faulted until healed": (
        [fault(Action.NO_NEW_WORK), empty, begin, healed("operator:ops")],
        [Stage.FAULTED, Stage.SERVING],
    ),
    "reset: drained, reset, checked, back": (
        RESET_AND_BACK,
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RESETTING, Stage.CHECKING, Stage.SERVING],
    ),
    "drain: drained, checked without a reset, back": (
        [fault(Action.DRAIN), empty, begin, check()],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.CHECKING, Stage.SERVING],
    ),
    "retire: drained, then retired without a reset": (
        [fault(Action.RETIRE), empty, begin],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RETIRED],
    ),
    "a card with holders stays quarantined": (
        [fault(Action.RESET), begin, reset(ResetOutcome.OK), check()],
        [Stage.QUARANTINED],
    ),
    "a failed reset retires": (
        [fault(Action.RESET), empty, begin, reset(ResetOutcome.FAILED)],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RESETTING, Stage.RETIRED],
    ),
    "a hung reset retires": (
        [fault(Action.RESET), empty, begin, reset(ResetOutcome.HUNG)],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RESETTING, Stage.RETIRED],
    ),
    "a reset the card does not support retires": (
        [fault(Action.RESET), empty, begin, reset(ResetOutcome.UNSUPPORTED)],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RESETTING, Stage.RETIRED],
    ),
    "a failed check retires": (
        [fault(Action.RESET), empty, begin, reset(ResetOutcome.OK), check("row remapping pending")],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RESETTING, Stage.CHECKING, Stage.RETIRED],
    ),
    "a fault while checked retires": (
        [fault(Action.DRAIN), empty, begin, fault(Action.DRAIN), check()],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.CHECKING, Stage.RETIRED],
    ),
    "a greater need raises the goal, a lesser one does not": (
        [fault(Action.DRAIN), fault(Action.NO_NEW_WORK), fault(Action.RESET), empty, begin],
        [Stage.QUARANTINED, Stage.QUARANTINED, Stage.DRAINED, Stage.RESETTING],
    ),
    "a fault that needs a drain moves a faulted card on": (
        [fault(Action.NO_NEW_WORK), fault(Action.DRAIN)],
        [Stage.FAULTED, Stage.QUARANTINED],
    ),
    "events of the reset itself change nothing": (
        [fault(Action.RESET), empty, begin, fault(Action.RESET)],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RESETTING],
    ),
    "a second fault within the window retires once drained": (
        [*RESET_AND_BACK, fault(Action.DRAIN), empty],
        [
            *(Stage.QUARANTINED, Stage.DRAINED, Stage.RESETTING, Stage.CHECKING, Stage.SERVING),
            *(Stage.QUARANTINED, Stage.DRAINED, Stage.RETIRED),
        ],
    ),
    "a retired card stays retired whatever comes": (
        [fault(Action.RETIRE), empty, fault(Action.RESET), empty, begin, healed("rule:recover-after")],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RETIRED, Stage.SERVING],
    ),
    "an operator's heal ends a remediation at any stage": (
        [fault(Action.RESET), empty, healed("operator:ops")],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.SERVING],
    ),
    "an operator retires a serving card: drained first": (
        [retire, empty, retire],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RETIRED],
    ),
    "a restart in the middle of a reset does it again": (
        [fault(Action.RESET), empty, begin, resume, begin, reset(ResetOutcome.OK)],
        [Stage.QUARANTINED, Stage.DRAINED, Stage.RESETTING, Stage.DRAINED, Stage.RESETTING, Stage.CHECKING],
    ),
}


@pytest.mark.parametrize(("inputs", "stages"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_scenario(inputs: list[Input], stages: list[Stage]) -> None:
    book = RemediationBook(RemediationPolicy(retire_window_s=600))
    for i, step in enumerate(inputs):
        step(book, 100.0 + i)
    assert [s.stage for s in book.of(A).history] == stages
    assert book.of(B).stage is Stage.SERVING


def test_a_fault_after_the_window_is_a_new_episode() -> None:
    book = RemediationBook(RemediationPolicy(retire_window_s=600))
    for i, step in enumerate(RESET_AND_BACK):
        step(book, 100.0 + i)
    [again] = book.on_fault(A, Action.DRAIN, "XID 48", 104.0 + 600)
    assert (again.stage, book.of(A).goal, again.took_s) == (Stage.QUARANTINED, Action.DRAIN, 0.0)


def test_an_operator_s_return_forgets_the_window() -> None:
    book = RemediationBook(RemediationPolicy(retire_window_s=600))
    for i, step in enumerate([*RESET_AND_BACK, fault(Action.DRAIN), empty]):
        step(book, 100.0 + i)
    book.on_healed(A, "operator:ops", 110.0)
    book.on_fault(A, Action.DRAIN, "XID 48", 111.0)
    assert book.of(A).goal is Action.DRAIN


def test_steps_say_the_time_since_the_fault() -> None:
    book = RemediationBook()
    book.on_fault(A, Action.RESET, "XID 79", 10.0)
    [drained] = book.on_empty(A, 25.0)
    book.begin(A, 26.0)
    book.on_reset(A, ResetOutcome.OK, "", 30.0)
    [back] = book.on_check(A, (), 31.0)
    assert (drained.took_s, back.took_s, back.stage) == (15.0, 21.0, Stage.SERVING)


@pytest.mark.parametrize(
    ("stage", "remedy"),
    [
        (Stage.SERVING, Remedy.NONE),
        (Stage.FAULTED, Remedy.NONE),
        (Stage.QUARANTINED, Remedy.DRAIN),
        (Stage.DRAINED, Remedy.RESET),
        (Stage.RESETTING, Remedy.RESET),
        (Stage.CHECKING, Remedy.RESET),
        (Stage.RETIRED, Remedy.RETIRED),
    ],
)
def test_each_stage_publishes_its_remedy(stage: Stage, remedy: Remedy) -> None:
    book = RemediationBook()
    book._move(A, stage, "", 1.0)
    assert book.of(A).remedy is remedy


def test_a_storm_on_one_card_never_moves_another() -> None:
    book = RemediationBook()
    for i in range(1000):
        book.on_fault(A, Action.RESET if i % 2 else Action.DRAIN, f"XID {i}", float(i))
    assert book.of(A).stage is Stage.QUARANTINED and book.of(B).stage is Stage.SERVING
    assert len(book.of(A).history) == 2  # the fault, and the one that raised its need
    assert set(book.cards) == {A}


def test_a_card_s_history_is_bounded() -> None:
    book = RemediationBook()
    for i in range(50):
        book.on_fault(A, Action.DRAIN, "XID 48", 2.0 * i)
        book.on_healed(A, "operator:ops", 2.0 * i + 1)
    assert len(book.of(A).history) == HISTORY_LIMIT


def test_the_book_survives_a_restart() -> None:
    book = RemediationBook()
    for i, step in enumerate([fault(Action.RESET), empty, begin]):
        step(book, 100.0 + i)
    again = RemediationBook.from_json(book.to_json(), book.policy)
    before, after = book.of(A), again.of(A)
    assert replace(after, history=()) == replace(before, history=())
    assert [(s.at, s.stage, s.reason) for s in after.history] == [(s.at, s.stage, s.reason) for s in before.history]
    assert [s.stage for s in again.resume(200.0)] == [Stage.DRAINED]


@pytest.mark.parametrize(
    ("cause", "action", "need"),
    [
        (Cause.XID, Action.RESET, Action.RESET),
        (Cause.LOST, Action.RESET, Action.RESET),
        (Cause.ECC, Action.DRAIN, Action.DRAIN),
        (Cause.OPERATOR, Action.RETIRE, Action.RETIRE),
        (Cause.REGISTRATION, Action.NO_NEW_WORK, Action.NO_NEW_WORK),
        (Cause.EVENT, Action.RESET, Action.NO_NEW_WORK),
        (Cause.NVML, Action.DRAIN, Action.NO_NEW_WORK),
    ],
)
def test_a_fault_that_fails_every_card_never_drains_one(cause: Cause, action: Action, need: Action) -> None:
    assert need_of(CardHealth(Health.UNHEALTHY, cause, "why", 1.0, cause.value, action)) is need


# --- a start without a saved book: the remedies the node's ledger still shows ------------------------

XID79 = "XID 79: GPU has fallen off the bus"


@pytest.mark.parametrize(
    ("remedy", "reason", "stage", "goal"),
    [
        (Remedy.DRAIN, XID79, Stage.QUARANTINED, Action.RESET),  # the XID's own action
        (Remedy.DRAIN, "XID 151: a drain", Stage.QUARANTINED, Action.DRAIN),
        (Remedy.DRAIN, "XID 64: row remapping failed", Stage.QUARANTINED, Action.RETIRE),
        (Remedy.DRAIN, "marked unhealthy by an operator", Stage.QUARANTINED, Action.RESET),  # the ledger does not say
        (Remedy.DRAIN, "XID 94: contained", Stage.QUARANTINED, Action.RESET),  # no-new-work never drains: reset
        (Remedy.RESET, XID79, Stage.DRAINED, Action.RESET),  # its reset and check are done again
        (Remedy.RESET, "XID 151: a drain", Stage.DRAINED, Action.DRAIN),  # only checked again
        (Remedy.RESET, "XID 64: row remapping failed", Stage.DRAINED, Action.RESET),
        (Remedy.RETIRED, "", Stage.RETIRED, Action.RETIRE),
    ],
)
def test_a_remedy_in_the_ledger_resumes_at_its_stage(remedy: Remedy, reason: str, stage: Stage, goal: Action) -> None:
    book = RemediationBook()
    faults = FaultPolicy({151: Action.DRAIN})
    [step] = book.adopt(A, remedy, resumed_goal(remedy, reason, faults), reason, 50.0)
    card = book.of(A)
    assert (step.stage, card.stage, card.goal, card.remedy, card.since) == (stage, stage, goal, remedy, 50.0)
    assert step.reason.startswith(f"resumed from the ledger's remedy {remedy.value} after a restart")


def test_a_resumed_card_goes_on_from_its_stage() -> None:
    book = RemediationBook()
    book.adopt(A, Remedy.DRAIN, Action.RESET, XID79, 1.0)
    book.adopt(B, Remedy.RESET, Action.RESET, XID79, 1.0)
    book.on_empty(A, 2.0)
    assert book.next_work(A) is Stage.RESETTING and book.next_work(B) is Stage.RESETTING
    assert book.on_fault(B, Action.RESET, XID79, 3.0) == []  # the same fault again changes nothing


def test_no_remedy_or_a_card_the_book_knows_is_not_adopted() -> None:
    book = RemediationBook()
    assert book.adopt(A, Remedy.NONE, Action.RESET, "", 1.0) == []
    book.on_fault(B, Action.DRAIN, "XID 151", 1.0)  # a fault since the start: its own account
    assert book.adopt(B, Remedy.RESET, Action.RESET, XID79, 2.0) == []
    assert book.of(B).stage is Stage.QUARANTINED


@dataclass
class _Host:
    state: NodeState

    def nvml_released(self) -> AbstractAsyncContextManager[None]:
        raise AssertionError("not reset here")

    async def nvml_ready(self) -> None:
        return None

    async def changed(self, steps: list[Step], transitions: list[Transition]) -> None:
        return None


def test_the_remediator_adopts_the_ledger_s_remedies_and_keeps_the_cards_unhealthy() -> None:
    cards = (
        Card(A, 0, "H100", 81559, health=Health.UNHEALTHY, health_reason=XID79, remedy=Remedy.DRAIN),
        Card(B, 1, "H100", 81559, health=Health.UNHEALTHY, health_reason="bad fan", remedy=Remedy.RETIRED),
        Card(CardUuid("GPU-c"), 2, "H100", 81559),
    )
    host = _Host(NodeState(NodeName("gpu-a"), "fake", HealthBook()))
    remediator = Remediator(host, cast(Resetter, None), cast(Checker, None), clock=lambda: 7.0, interval_s=1.0)
    steps, transitions = remediator.adopt(NodeLedger(Node(NodeName("gpu-a"), cards)), 7.0)
    assert [(s.uuid, s.stage) for s in steps] == [(A, Stage.QUARANTINED), (B, Stage.RETIRED)]
    assert [(t.uuid, t.health, t.by, t.action) for t in transitions] == [
        (A, Health.UNHEALTHY, "ledger", Action.RESET),
        (B, Health.UNHEALTHY, "ledger", Action.RETIRE),
    ]
    assert host.state.book.of(A).reason == XID79 and host.state.book.of(B).cause is Cause.LEDGER
    assert remediator.observe(transitions) == []  # the health book's transitions move nothing further
    assert host.state.card(_info(cards[0])).remedy is Remedy.DRAIN
    assert remediator.adopt(None, 8.0) == ([], [])


def _info(card: Card) -> CardInfo:
    return CardInfo(replace(card, health=Health.HEALTHY, health_reason="", remedy=Remedy.NONE))


@pytest.mark.parametrize(
    "inputs",
    [
        [fault(Action.NO_NEW_WORK)],
        [fault(Action.RESET)],
        [fault(Action.RESET), empty],
        [fault(Action.RESET), empty, begin],
        [fault(Action.RESET), empty, begin, reset(ResetOutcome.OK)],
        [fault(Action.RETIRE), empty],
        [retire],
    ],
    ids=["faulted", "quarantined", "drained", "resetting", "checking", "retired", "retiring"],
)
def test_an_operator_s_heal_wins_at_every_stage(inputs: list[Input]) -> None:
    book = RemediationBook()
    for i, step in enumerate(inputs):
        step(book, 100.0 + i)
    [back] = book.on_healed(A, "operator:ops", 200.0)
    assert (back.stage, back.reason, book.of(A).remedy) == (Stage.SERVING, "healed by operator:ops", Remedy.NONE)
    assert book.on_reset(A, ResetOutcome.OK, "", 201.0) == [] and book.on_check(A, (), 201.0) == []


def test_a_card_the_ledger_shows_unhealthy_under_no_remedy_stays_unhealthy_after_a_restart() -> None:
    """Without a saved book a no-new-work fault (or an operator's word) is not forgotten; a card
    unhealthy only because NVML failed is left to NVML, which the inventory asks again."""
    nvml_down = "NVML failed: the driver is not loaded"
    cards = (
        Card(A, 0, "H100", 81559, health=Health.UNHEALTHY, health_reason="XID 94: contained ECC error"),
        Card(B, 1, "H100", 81559, health=Health.UNHEALTHY, health_reason=nvml_down),
        Card(CardUuid("GPU-c"), 2, "H100", 81559),
    )
    host = _Host(NodeState(NodeName("gpu-a"), "fake", HealthBook(HealthPolicy(recover_after_s=60.0))))
    remediator = Remediator(host, cast(Resetter, None), cast(Checker, None), clock=lambda: 7.0, interval_s=1.0)
    steps, transitions = remediator.adopt(NodeLedger(Node(NodeName("gpu-a"), cards)), 7.0)
    assert [(s.uuid, s.stage) for s in steps] == [(A, Stage.FAULTED)]
    assert [(t.uuid, t.health, t.by, t.action) for t in transitions] == [
        (A, Health.UNHEALTHY, "ledger", Action.NO_NEW_WORK)
    ]
    assert host.state.book.of(A).reason == "XID 94: contained ECC error"
    assert host.state.book.of(B).health is Health.HEALTHY
    assert remediator.book.of(A).remedy is Remedy.NONE  # nothing moves its holders
    assert host.state.book.tick(10_000.0) == []  # no rule heals it (its fault's time is unknown): an operator does
    saved = _Host(NodeState(NodeName("gpu-a"), "fake", HealthBook()))
    again = Remediator(saved, cast(Resetter, None), cast(Checker, None), clock=lambda: 7.0, interval_s=1.0)
    assert again.adopt(NodeLedger(Node(NodeName("gpu-a"), cards)), 7.0, health_saved=True) == ([], [])
