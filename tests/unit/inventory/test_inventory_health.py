"""Health transitions: what turns a card unhealthy, and the only ways back."""

from __future__ import annotations

import pytest

from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Health
from gpuledger_inventory.health import Cause, HealthBook, HealthPolicy
from gpuledger_inventory.inventory import EventKind, GpuEvent

pytestmark = pytest.mark.timeout(5)

A, B = CardUuid("GPU-a"), CardUuid("GPU-b")


def xid(number: int, uuid: CardUuid | None = A) -> GpuEvent:
    return GpuEvent(EventKind.XID, uuid, number)


@pytest.mark.parametrize("number", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored_by_default(number: int) -> None:
    book = HealthBook()
    assert book.on_event(xid(number), [A, B], 1.0) == []
    assert book.of(A).health is Health.HEALTHY


@pytest.mark.parametrize("number", [48, 63, 64, 74, 79, 92, 94, 95])
def test_critical_xids_turn_the_card_unhealthy_at_once(number: int) -> None:
    book = HealthBook()
    [t] = book.on_event(xid(number), [A, B], 1.0)
    assert (t.uuid, t.health, t.reason, t.by) == (A, Health.UNHEALTHY, f"XID {number}", "xid")
    assert book.of(B).health is Health.HEALTHY


def test_the_ignored_list_is_configurable() -> None:
    book = HealthBook(HealthPolicy(ignored_xids=frozenset({79})))
    assert book.on_event(xid(79), [A], 1.0) == []
    assert len(book.on_event(xid(13), [A], 1.0)) == 1


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


def test_recover_after_rule() -> None:
    book = HealthBook(HealthPolicy(recover_after_s=60))
    book.on_event(xid(79), [A], 100.0)
    book.on_lost(B, 100.0)
    assert book.tick(159.0) == []
    [t] = book.tick(160.0)
    assert (t.uuid, t.by) == (A, "rule:recover-after")
    assert book.of(B).health is Health.UNHEALTHY  # a lost card is not a passing fault


def test_an_operator_can_mark_a_card_unhealthy_and_only_an_operator_undoes_it() -> None:
    book = HealthBook(HealthPolicy(recover_after_s=1))
    [t] = book.set(A, False, "bob", "fan noise", 1.0)
    assert (t.health, t.by) == (Health.UNHEALTHY, "operator:bob")
    assert book.tick(100.0) == []
    assert book.on_nvml_up(100.0) == []


def test_the_book_survives_a_round_trip() -> None:
    book = HealthBook()
    book.on_event(xid(79), [A], 1.0)
    book.set(B, False, "bob", "", 2.0)
    again = HealthBook.from_json(book.to_json(), HealthPolicy())
    assert again.cards == book.cards
    assert again.log == book.log
