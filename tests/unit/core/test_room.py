"""The one per-card rule (``room.refusal``), the cases its callers differ in, and its reasons."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger_core.model import CORE_WHOLE, Isolation, Request
from gpuledger_core.room import UNTRACKED, CardState, Refusal, Want, card_state, refusal, why_not
from gpuledger_core.usage import CardUse

from .builders import card, share

pytestmark = pytest.mark.timeout(10)

MPS, NONE = Isolation.MPS, Isolation.NONE
IDLE = CardState(0, "A100", CORE_WHOLE, 40960, 40960)
SHARED = CardState(0, "A100", 600, 40960, 10000, idle=False, tiers=frozenset({NONE}))
SMALL = Want(False, 100, 1000)


@pytest.mark.parametrize(
    ("card_", "want", "mix", "expected"),
    [
        (IDLE, SMALL, False, None),
        (replace(IDLE, healthy=False), SMALL, False, Refusal.UNHEALTHY),
        (IDLE, Want(False, 100, 1000, frozenset({"T4"})), False, Refusal.MODEL),
        (IDLE, Want(False, 100, 1000, frozenset({"T4", "A100"})), False, None),
        (replace(IDLE, slots_free=0), SMALL, False, Refusal.SLOTS),
        (replace(IDLE, slots_free=1), SMALL, False, None),
        (replace(IDLE, slots_free=UNTRACKED), SMALL, False, None),  # slots not counted
        (IDLE, Want(True, CORE_WHOLE, 0), False, None),
        (SHARED, Want(True, CORE_WHOLE, 0), False, Refusal.HELD),
        (SHARED, Want(False, 100, 10001), False, Refusal.MEMORY),
        (SHARED, Want(False, 601, 1000), False, Refusal.COMPUTE),
        (SHARED, Want(False, 600, 10000), False, None),
        (SHARED, Want(False, 100, 1000, isolation=MPS), False, Refusal.TIER),
        (SHARED, Want(False, 100, 1000, isolation=MPS), True, None),  # mix_isolation
        (CardState(0, "A100", 600, idle=False), Want(False, 100, 10**6), False, None),  # memory not counted
        (CardState(0, "A100", CORE_WHOLE, 0, 0), Want(False, 100, 1), False, Refusal.MEMORY),  # size unknown
        (CardState(0, "A100", CORE_WHOLE, 0, 0), Want(False, 100, 0), False, None),
    ],
)
def test_refusal(card_: CardState, want: Want, mix: bool, expected: Refusal | None) -> None:
    assert refusal(card_, want, mix) is expected


def test_a_want_is_one_card_of_a_request() -> None:
    assert Want.of(Request(2, mem_mib=100, core_milli=30), MPS) == Want(False, 30, 100, isolation=MPS)
    assert Want.of(Request(1, mem_mib=100)) == Want(False, 0, 100)
    assert Want.of(Request(1, models=frozenset({"T4"}))) == Want(True, CORE_WHOLE, 0, frozenset({"T4"}))


def test_a_live_card_as_its_holders_leave_it() -> None:
    use = CardUse().plus(share(0, 3000, 250), MPS)
    assert card_state(card(0, 8000), use, 3) == CardState(
        0, card(0).model, 750, 8000, 5000, idle=False, numa=0, slots_free=3, tiers=frozenset({MPS})
    )
    assert card_state(card(1, 8000), None) == CardState(1, card(1).model, CORE_WHOLE, 8000, 8000, numa=0)


@pytest.mark.parametrize(
    ("cards", "want", "count", "reason"),
    [
        ((IDLE,), Want(False, 1, 1, frozenset({"T4"})), 1, "no card of model T4 (has A100)"),
        ((IDLE, replace(IDLE, healthy=False)), SMALL, 2, "1 healthy card(s) of the 2 needed"),
        ((IDLE, SHARED), Want(True, CORE_WHOLE, 0), 2, "1 free whole card(s) of the 2 needed"),
        (
            (replace(SHARED, slots_free=0),),
            SMALL,
            1,
            "slots used up: 1 card(s) have every kubelet slot held, 0 card(s) with a free slot of the 1 needed",
        ),
        (
            (SHARED,),
            Want(False, 1, 1, isolation=MPS),
            1,
            "1 card(s) held by another isolation tier (isolation mps does not share a card with none tenants "
            "(mix_isolation is off)), 0 card(s) of the 1 needed",
        ),
        ((SHARED,), Want(False, 1, 12000), 1, "card 0 has 10000 MiB free, 2000 MiB short of 12000 MiB"),
        ((SHARED,), Want(False, 700, 1), 1, "card 0 has 60% compute free, 10% short of 70%"),
        (
            (SHARED, replace(SHARED, index=1, slots_free=0)),
            Want(False, 1, 12000),
            1,
            "card 0 has 10000 MiB free, 2000 MiB short of 12000 MiB; "
            "1 other card(s) have every kubelet slot held (slots used up)",
        ),
        (
            (SHARED, replace(SHARED, index=1, core_free=100, mem_free=20000)),
            Want(False, 500, 12000),
            1,
            "0 card(s) with room of the 1 needed",
        ),
    ],
)
def test_why_not(cards: tuple[CardState, ...], want: Want, count: int, reason: str) -> None:
    assert why_not(cards, want, count) == reason
