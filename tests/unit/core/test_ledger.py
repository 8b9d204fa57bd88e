from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from gpuledger_core.errors import Exhausted, FailedPrecondition, InvalidArgument, NotFound, Released
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import (
    RELEASED_KEPT,
    RELEASED_RETENTION_S,
    NodeLedger,
    commit,
    expire,
    forget,
    next_lease_expiry,
    prune,
    release,
    reserve,
    tidy,
    with_node,
)
from gpuledger_core.model import AllocState, CardShare, Grant, Health

from .builders import allocation, card, holding, ledger, node, share, uuid_of, whole

A, B, C = AllocationId("a"), AllocationId("b"), AllocationId("c")


def test_reserve_adds_the_allocation() -> None:
    pod = holding("a", share(0, 1000, 100))
    after = reserve(ledger(8000), pod)
    assert after.allocations == (pod,)
    assert after.get(A) is pod


def test_reserve_on_the_wrong_node_is_an_invalid_argument() -> None:
    elsewhere = allocation("a", Grant("main", (share(0, 1),)), name=NodeName("node-b"))
    with pytest.raises(InvalidArgument) as caught:
        reserve(ledger(8000), elsewhere)
    assert caught.value.field == "node"


def test_reserving_an_id_twice_fails() -> None:
    once = reserve(ledger(8000), holding("a", share(0, 1)))
    with pytest.raises(FailedPrecondition, match="allocation a already exists"):
        reserve(once, holding("a", share(0, 1)))


@pytest.mark.parametrize(
    ("held", "wanted", "message"),
    [
        (
            [share(0, 5000, 100)],
            share(0, 3500, 100),
            "card 0 (GPU-0000) on node-a has 3000 MiB free, needs 3500 MiB",
        ),
        (
            [share(0, 100, 700)],
            share(0, 100, 400),
            "card 0 (GPU-0000) on node-a has 30% compute free, needs 40%",
        ),
        (
            [share(0, 100, 10), share(0, 100, 10)],
            whole(card(0, 8000)),
            "card 0 (GPU-0000) on node-a is held by 2 other(s)",
        ),
        ([whole(card(0, 8000))], share(0, 1, 1), "has 0 MiB free, needs 1 MiB"),
        ([], share(0, 8001, 1), "card 0 (GPU-0000) on node-a has 8000 MiB free, needs 8001 MiB"),
        ([], CardShare(CardUuid("GPU-gone"), 9, 1, 1), "card GPU-gone is not on node node-a"),
    ],
)
def test_reserve_names_the_card_and_what_it_lacks(held: list[CardShare], wanted: CardShare, message: str) -> None:
    before = ledger(8000)
    for i, s in enumerate(held):
        before = reserve(before, holding(f"h{i}", s))
    with pytest.raises(Exhausted) as caught:
        reserve(before, holding("new", wanted))
    assert message in str(caught.value)
    # nothing is half-written: the old value is untouched
    assert [a.id for a in before.allocations] == [f"h{i}" for i in range(len(held))]


def test_reserve_refuses_an_unhealthy_card() -> None:
    sick = NodeLedger(replace(node(8000), cards=(card(0, 8000, healthy=False),)))
    with pytest.raises(Exhausted, match=r"card 0 \(GPU-0000\) on node-a is unhealthy"):
        reserve(sick, holding("a", share(0, 1)))


def test_reserve_checks_the_allocation_as_a_whole_per_card() -> None:
    # two containers, each small enough alone, too big together on the same card
    pod = allocation("a", Grant("x", (share(0, 5000),)), Grant("y", (share(0, 4000),)))
    with pytest.raises(Exhausted, match="has 8000 MiB free, needs 9000 MiB"):
        reserve(ledger(8000), pod)


def test_reserve_counts_init_containers_as_the_larger_share() -> None:
    pod = allocation("a", Grant("init", (share(0, 6000),), init=True), Grant("app", (share(0, 5000),)))
    after = reserve(ledger(8000), pod)
    assert after.use()[uuid_of(0)].mem_mib == 6000


def test_a_forgotten_released_allocation_can_be_reserved_again_under_its_id() -> None:
    """A claim allocated again exactly as before gets the same id: its released record is dropped."""
    full = reserve(ledger(8000), holding("a", whole(card(0, 8000))))
    freed = release(full, A, now=5.0)
    with pytest.raises(FailedPrecondition):
        reserve(freed, holding("a", whole(card(0, 8000))))
    again = reserve(forget(freed, A), holding("a", whole(card(0, 8000))))
    assert again.get(A) is not None and again.get(A).live  # type: ignore[union-attr]
    assert forget(full, A) is full and forget(full, B) is full  # live or unknown: untouched


def test_released_allocations_free_their_cards() -> None:
    full = reserve(ledger(8000), holding("a", whole(card(0, 8000))))
    freed = release(full, A, now=5.0)
    assert reserve(freed, holding("b", share(0, 8000))).get(B) is not None


def test_commit_binds_a_reservation_and_ends_its_lease() -> None:
    held = reserve(ledger(8000), holding("a", share(0, 1), lease=30.0))
    bound = commit(held, A, now=10.0)
    got = bound.get(A)
    assert got is not None
    assert (got.state, got.updated_at, got.lease_expires_at) == (AllocState.BOUND, 10.0, None)


def test_commit_of_a_bound_allocation_changes_nothing() -> None:
    bound = commit(reserve(ledger(8000), holding("a", share(0, 1), lease=30.0)), A, now=10.0)
    assert commit(bound, A, now=20.0) is bound


def test_commit_of_a_released_allocation_is_a_failed_precondition() -> None:
    gone = release(reserve(ledger(8000), holding("a", share(0, 1))), A, now=1.0, reason="pod deleted")
    with pytest.raises(Released, match=r"allocation a was released \(pod deleted\)") as raised:
        commit(gone, A, now=2.0)
    assert isinstance(raised.value, FailedPrecondition)


def test_a_reservation_is_held_until_its_lease_runs_out_and_a_binding_for_good() -> None:
    held = reserve(ledger(8000), holding("a", share(0, 1), lease=30.0)).get(A)
    assert held is not None and held.held_at(29.9) and not held.held_at(30.0)
    bound = commit(reserve(ledger(8000), holding("a", share(0, 1), lease=30.0)), A, now=10.0).get(A)
    assert bound is not None and bound.held_at(1e12)
    gone = release(reserve(ledger(8000), holding("a", share(0, 1))), A, now=1.0).get(A)
    assert gone is not None and not gone.held_at(0.0)


@pytest.mark.parametrize("operation", [commit, release])
def test_an_unknown_allocation_is_not_found(
    operation: Callable[[NodeLedger, AllocationId, float], NodeLedger],
) -> None:
    with pytest.raises(NotFound, match="allocation zz is not on node node-a"):
        operation(ledger(8000), AllocationId("zz"), 1.0)


def test_release_records_when_and_why() -> None:
    held = reserve(ledger(8000), holding("a", share(0, 1), lease=30.0))
    gone = release(held, A, now=7.0, reason="pod deleted").get(A)
    assert gone is not None
    assert (gone.state, gone.updated_at, gone.reason, gone.lease_expires_at) == (
        AllocState.RELEASED,
        7.0,
        "pod deleted",
        None,
    )


def test_release_is_idempotent() -> None:
    once = release(reserve(ledger(8000), holding("a", share(0, 1))), A, now=7.0, reason="first")
    assert release(once, A, now=9.0, reason="second") is once


def _three_leases() -> NodeLedger:
    state = ledger(8000)
    state = reserve(state, holding("a", share(0, 1), lease=10.0))
    state = reserve(state, holding("b", share(0, 1), lease=20.0))
    state = reserve(state, holding("c", share(0, 1), lease=10.0))
    return commit(state, C, now=5.0)


def test_expire_releases_only_reservations_whose_lease_ran_out() -> None:
    after = expire(_three_leases(), now=10.0)
    states = {a.id: (a.state, a.reason) for a in after.allocations}
    assert states == {
        A: (AllocState.RELEASED, "lease expired"),
        B: (AllocState.RESERVED, ""),
        C: (AllocState.BOUND, ""),
    }


def test_expire_before_any_lease_ends_changes_nothing() -> None:
    state = _three_leases()
    assert expire(state, now=9.999) is state


def test_a_reservation_without_a_lease_never_expires() -> None:
    state = reserve(ledger(8000), holding("a", share(0, 1)))
    assert expire(state, now=1e12) is state


def test_next_lease_expiry_is_the_earliest_live_reservation() -> None:
    state = _three_leases()
    assert next_lease_expiry(state) == 10.0
    assert next_lease_expiry(release(state, A, now=6.0)) == 20.0
    assert next_lease_expiry(ledger(8000)) is None


def test_prune_forgets_old_releases_and_keeps_live_ones() -> None:
    state = reserve(ledger(8000), holding("a", share(0, 1)))
    state = reserve(state, holding("b", share(0, 1)))
    state = reserve(state, holding("c", share(0, 1)))
    state = release(state, A, now=100.0)
    state = release(state, B, now=200.0)
    later = 100.0 + RELEASED_RETENTION_S
    assert [a.id for a in prune(state, now=later).allocations] == [B, C]
    assert prune(state, now=later - 1) is state
    assert [a.id for a in prune(state, now=1e9).allocations] == [C]


def test_prune_remembers_only_the_newest_releases() -> None:
    state = ledger(8000)
    for i in range(RELEASED_KEPT + 3):
        state = reserve(state, holding(f"r{i}", share(0, 1)))
    state = reserve(state, holding("live", share(0, 1)))
    for i in reversed(range(RELEASED_KEPT + 3)):  # r0 is released last, so it is the newest
        state = release(state, AllocationId(f"r{i}"), now=100.0 - i)
    kept = [a.id for a in prune(state, now=101.0).allocations]
    assert kept == [f"r{i}" for i in range(RELEASED_KEPT)] + ["live"]


def test_tidy_expires_then_prunes() -> None:
    state = reserve(ledger(8000), holding("a", share(0, 1), lease=10.0))
    state = reserve(state, holding("b", share(0, 1)))
    state = release(state, B, now=1.0)
    tidied = tidy(state, now=1.0 + RELEASED_RETENTION_S)
    assert [(a.id, a.state, a.reason) for a in tidied.allocations] == [(A, AllocState.RELEASED, "lease expired")]


def test_with_node_keeps_allocations_on_new_inventory() -> None:
    state = reserve(ledger(8000), holding("a", share(0, 1)))
    sick = replace(node(8000), cards=(replace(card(0, 8000), health=Health.UNHEALTHY),))
    changed = with_node(state, sick)
    assert changed.node == sick
    assert changed.allocations == state.allocations


def test_of_owner_finds_only_live_allocations() -> None:
    state = reserve(ledger(8000), holding("a", share(0, 1)))
    assert state.of_owner("pod:uid-a") is state.get(A)
    assert release(state, A, now=1.0).of_owner("pod:uid-a") is None
    assert state.live() == state.allocations
    assert release(state, A, now=1.0).live() == ()
