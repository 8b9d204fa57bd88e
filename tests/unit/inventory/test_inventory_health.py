"""Health transitions: what turns a card unhealthy, and the only ways back."""

from __future__ import annotations

import pytest

from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Health
from gpuledger_inventory.faults import Action, FaultClass, FaultPolicy
from gpuledger_inventory.health import CardHealth, Cause, HealthBook, HealthPolicy
from gpuledger_inventory.inventory import EventKind, GpuEvent

pytestmark = pytest.mark.timeout(5)

A, B, C = CardUuid("GPU-a"), CardUuid("GPU-b"), CardUuid("GPU-c")


def xid(number: int, uuid: CardUuid | None = A) -> GpuEvent:
    return GpuEvent(EventKind.XID, uuid, number)


@pytest.mark.parametrize("number", [13, 31, 43, 45, 63, 68, 92])
def test_application_xids_leave_the_card_healthy(number: int) -> None:
    book = HealthBook()
    assert book.on_event(xid(number), [A, B], 1.0) == []
    assert book.of(A).health is Health.HEALTHY


@pytest.mark.parametrize(
    ("number", "action"),
    [
        (48, Action.RESET),
        (64, Action.RETIRE),
        (74, Action.RESET),
        (79, Action.RESET),
        (94, Action.NO_NEW_WORK),
        (95, Action.RESET),
        (109, Action.RESET),
        (151, Action.DRAIN),
        (999, Action.NO_NEW_WORK),
    ],
)
def test_card_faults_turn_the_card_unhealthy_at_once_with_their_action(number: int, action: Action) -> None:
    book = HealthBook()
    [t] = book.on_event(xid(number), [A, B], 1.0)
    assert (t.uuid, t.health, t.by, t.action) == (A, Health.UNHEALTHY, "xid", action)
    assert t.reason.startswith(f"XID {number}: ")
    assert book.of(A).action is action
    assert book.of(B).health is Health.HEALTHY


def test_overrides_change_what_an_xid_does() -> None:
    book = HealthBook(HealthPolicy(FaultPolicy({79: Action.APPLICATION, 13: Action.DRAIN})))
    assert book.on_event(xid(79), [A], 1.0) == []
    [t] = book.on_event(xid(13), [A], 1.0)
    assert t.action is Action.DRAIN


def test_a_more_severe_fault_raises_the_action_and_a_lesser_one_never_lowers_it() -> None:
    book = HealthBook()
    [first] = book.on_event(xid(154), [A], 1.0)
    assert first.action is Action.NO_NEW_WORK
    [raised] = book.on_event(xid(79), [A], 2.0)
    assert (raised.health, raised.action, raised.reason) == (
        Health.UNHEALTHY,
        Action.RESET,
        "XID 79: GPU has fallen off the bus",
    )
    assert book.on_event(xid(32), [A], 3.0) == []
    assert book.on_nvml_down([A], "gone", 4.0) == []
    assert (book.of(A).action, book.of(A).since, book.of(A).cause) == (Action.RESET, 1.0, Cause.XID)
    [retired] = book.on_event(xid(64), [A], 5.0)
    assert retired.action is Action.RETIRE
    assert [t.action for t in book.log] == [Action.NO_NEW_WORK, Action.RESET, Action.RETIRE]


def test_an_unattributed_fault_never_moves_anyones_holders() -> None:
    book = HealthBook()
    transitions = book.on_event(xid(79, None), [A, B], 1.0)
    assert {(t.uuid, t.action) for t in transitions} == {(A, Action.NO_NEW_WORK), (B, Action.NO_NEW_WORK)}
    assert book.on_event(xid(13, None), [A, B], 2.0) == []


@pytest.mark.parametrize(
    ("fault", "action", "cause"),
    [
        (FaultClass.ROW_REMAP_FAILURE, Action.RETIRE, Cause.ECC),
        (FaultClass.ECC_UNCORRECTABLE, Action.RESET, Cause.ECC),
        (FaultClass.LOST, Action.RESET, Cause.LOST),
        (FaultClass.UNKNOWN_XID, Action.NO_NEW_WORK, Cause.XID),
    ],
)
def test_faults_found_without_an_event(fault: FaultClass, action: Action, cause: Cause) -> None:
    book = HealthBook()
    [t] = book.on_fault(A, fault, "found by a check", 1.0)
    assert (t.action, book.of(A).cause, book.of(A).reason) == (action, cause, "found by a check")


def test_a_pending_row_remap_alone_leaves_the_card_serving() -> None:
    book = HealthBook()
    assert book.on_fault(A, FaultClass.ROW_REMAP_PENDING, "remap pending", 1.0) == []
    assert book.of(A).health is Health.HEALTHY


@pytest.mark.parametrize(
    ("event", "unhealthy"),
    [
        (GpuEvent(EventKind.ECC_DOUBLE, A), True),
        (GpuEvent(EventKind.ECC_SINGLE, A), False),
        (GpuEvent(EventKind.OTHER, A), False),
        (GpuEvent(EventKind.XID, A, 79, "MIG-x"), True),
    ],
)
def test_ecc_and_other_events(event: GpuEvent, unhealthy: bool) -> None:
    book = HealthBook()
    book.on_event(event, [A], 1.0)
    assert (book.of(A).health is Health.UNHEALTHY) is unhealthy
    assert (book.of(A).action is Action.RESET) is unhealthy


def test_the_reason_names_the_mig_instance() -> None:
    book = HealthBook()
    [t] = book.on_event(GpuEvent(EventKind.XID, A, 79, "MIG-x"), [A], 1.0)
    assert t.reason == "XID 79 on MIG-x: GPU has fallen off the bus"


def test_an_event_naming_no_card_marks_every_card() -> None:
    book = HealthBook()
    transitions = book.on_event(xid(79, None), [A, B], 1.0)
    assert {t.uuid for t in transitions} == {A, B}
    assert book.of(A).cause is Cause.EVENT


def test_never_healthy_again_silently() -> None:
    book = HealthBook()
    book.on_event(xid(79), [A], 1.0)
    assert book.tick(1e9) == []
    assert book.on_nvml_up(2.0) == []
    assert book.on_event(xid(79), [A], 3.0) == []  # already unhealthy: no new transition
    assert book.of(A).health is Health.UNHEALTHY
    [t] = book.set(A, True, "alice", "card replaced", 4.0)
    assert (t.health, t.by, t.reason) == (Health.HEALTHY, "operator:alice", "card replaced")
    assert [(x.health, x.by) for x in book.log] == [
        (Health.UNHEALTHY, "xid"),
        (Health.HEALTHY, "operator:alice"),
    ]
    assert book.set(A, True, "alice", "", 5.0) == []


def test_nvml_failure_marks_every_card_and_the_rule_heals_only_those() -> None:
    book = HealthBook()
    book.on_event(xid(79), [A], 1.0)
    transitions = book.on_nvml_down([A, B], "driver not loaded", 2.0)
    assert [t.uuid for t in transitions] == [B]
    assert book.of(B).reason == "NVML failed: driver not loaded"
    [t] = book.on_nvml_up(3.0)
    assert (t.uuid, t.by) == (B, "rule:nvml-returned")
    assert book.of(A).health is Health.UNHEALTHY


def test_a_hardware_fault_during_an_nvml_failure_outlives_it() -> None:
    book = HealthBook()
    book.on_nvml_down([A], "gone", 1.0)
    book.on_event(xid(79), [A], 2.0)
    assert book.on_nvml_up(3.0) == []
    assert book.of(A).cause is Cause.XID


def test_the_nvml_rule_can_be_turned_off() -> None:
    book = HealthBook(HealthPolicy(recover_on_nvml_return=False))
    book.on_nvml_down([A], "gone", 1.0)
    assert book.on_nvml_up(2.0) == []


def test_recover_after_rule_heals_only_what_needs_no_more_than_no_new_work() -> None:
    book = HealthBook(HealthPolicy(recover_after_s=60))
    book.on_event(xid(154), [A], 100.0)
    book.on_lost(B, 100.0)
    book.on_event(xid(79, C), [C], 100.0)
    assert book.tick(159.0) == []
    [t] = book.tick(160.0)
    assert (t.uuid, t.by, t.action) == (A, "rule:recover-after", Action.APPLICATION)
    assert book.of(B).health is Health.UNHEALTHY  # a lost card is not a passing fault
    assert book.of(C).action is Action.RESET  # remediation or an operator brings it back


def test_an_operator_can_mark_a_card_unhealthy_and_only_an_operator_undoes_it() -> None:
    book = HealthBook(HealthPolicy(recover_after_s=1))
    [t] = book.set(A, False, "bob", "fan noise", 1.0)
    assert (t.health, t.by, t.action) == (Health.UNHEALTHY, "operator:bob", Action.NO_NEW_WORK)
    assert book.tick(100.0) == []
    assert book.on_nvml_up(100.0) == []
    assert book.set(A, False, "bob", "again", 2.0) == []
    [t] = book.set(A, False, "bob", "bad fan, replace it", 3.0, Action.RETIRE)
    assert (t.action, book.of(A).reason) == (Action.RETIRE, "bad fan, replace it")


def test_an_operator_cannot_mark_a_card_unhealthy_with_nothing_to_do() -> None:
    [t] = HealthBook().set(A, False, "bob", "", 1.0, Action.APPLICATION)
    assert t.action is Action.NO_NEW_WORK


def test_the_book_survives_a_round_trip() -> None:
    book = HealthBook()
    book.on_event(xid(79), [A], 1.0)
    book.set(B, False, "bob", "", 2.0)
    again = HealthBook.from_json(book.to_json(), HealthPolicy())
    assert again.cards == book.cards
    assert again.log == book.log
    assert again.of(A).action is Action.RESET


def test_a_book_saved_before_actions_loads_with_the_action_each_cause_implies() -> None:
    def card(cause: str, reason: str, health: str = "unhealthy") -> dict[str, object]:
        return {"health": health, "cause": cause, "reason": reason, "since": 1.0, "by": cause}

    old = {
        "cards": {
            "GPU-1": card("xid", "XID 79"),
            "GPU-2": card("xid", "XID 64 on MIG-x"),
            "GPU-3": card("ecc", "double-bit ECC error"),
            "GPU-4": card("nvml", "NVML failed: gone"),
            "GPU-5": card("xid", "XID 13"),  # once configured as a fault: still one
            "GPU-6": card("", "", "healthy"),
        },
        "log": [{"at": 1.0, "uuid": "GPU-1", "health": "unhealthy", "reason": "XID 79", "by": "xid"}],
    }
    book = HealthBook.from_json(old, HealthPolicy(FaultPolicy({79: Action.RETIRE})))
    actions = {u: h.action for u, h in book.cards.items()}
    assert actions == {
        "GPU-1": Action.RETIRE,
        "GPU-2": Action.RETIRE,
        "GPU-3": Action.RESET,
        "GPU-4": Action.NO_NEW_WORK,
        "GPU-5": Action.NO_NEW_WORK,
        "GPU-6": Action.APPLICATION,
    }
    assert book.log[0].action is Action.NO_NEW_WORK  # what every fault meant when it was logged


def test_an_unhealthy_card_made_without_an_action_gets_its_causes() -> None:
    assert CardHealth(Health.UNHEALTHY, Cause.LOST, "lost").action is Action.RESET
    assert CardHealth(Health.UNHEALTHY, Cause.XID, "XID 95").action is Action.RESET
    assert CardHealth(Health.UNHEALTHY, Cause.XID, "an XID").action is Action.NO_NEW_WORK
    assert CardHealth().action is Action.APPLICATION
