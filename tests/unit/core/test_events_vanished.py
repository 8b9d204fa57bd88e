"""A live allocation that is gone from the next value of the ledger must still be announced."""

from __future__ import annotations

from gpuledger_core.events import EventKind, LedgerEvent, diff
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import RELEASED_KEPT, NodeLedger, expire, prune, reserve, tidy

from .builders import holding, ledger, share


def _released(events: tuple[LedgerEvent, ...]) -> set[AllocationId]:
    return {e.allocation.id for e in events if e.kind is EventKind.RELEASED and e.allocation}


def test_many_leases_running_out_in_one_tidy_are_all_announced() -> None:
    current: NodeLedger = ledger(80000)
    for i in range(RELEASED_KEPT + 2):
        current = reserve(current, holding(f"r{i}", share(0, 10, 10), lease=10.0))
    new = tidy(current, now=20.0)  # what every store write does before its transition
    assert _released(diff(current, new, 2)) == {a.id for a in current.allocations}


def test_a_release_forgotten_in_the_same_write_is_announced() -> None:
    old = reserve(ledger(8000), holding("a", share(0, 1), lease=10.0))
    new = prune(expire(old, now=20.0), now=20.0, keep_s=0.0)
    assert new.allocations == ()
    assert _released(diff(old, new, 2)) == {AllocationId("a")}
