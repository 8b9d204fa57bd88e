"""The view's indexes (where each allocation lives, and each owner's live allocation) follow the
values applied to it, including allocations that change, are released, or are pruned."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuledger_allocator.view import ClusterView
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import AllocState, Grant
from tests.unit.core.builders import NODE, allocation, ledger, share


class _Store:
    """What the view asks of the ledger store here: to be told of newer values."""

    def remember(self, *_: Any) -> None:
        pass


def test_indexes_follow_reserve_release_and_prune() -> None:
    view = ClusterView(_Store())  # type: ignore[arg-type]
    empty = ledger(8000)
    a = allocation("a", Grant("", (share(0, 1000),)))
    b = allocation("b", Grant("", (share(0, 1000),)))
    view.apply(NODE, NodeLedger(empty.node, (a,)), 1)
    assert (view.node_of(AllocationId("a")), view.owned_by(a.owner)) == (NODE, "a")

    view.apply(NODE, NodeLedger(empty.node, (a, b)), 2)  # a unchanged, b new
    assert (view.owned_by(a.owner), view.owned_by(b.owner)) == ("a", "b")

    gone = replace(a, state=AllocState.RELEASED, updated_at=5.0)
    view.apply(NODE, NodeLedger(empty.node, (gone, b)), 3)
    assert view.owned_by(a.owner) is None  # released: no longer the owner's
    assert view.node_of(AllocationId("a")) == NODE  # still in the node's key

    assert not view.left_its_node(AllocationId("a"))
    view.apply(NODE, NodeLedger(empty.node, (b,)), 4)  # a pruned
    assert view.node_of(AllocationId("a")) is None
    assert view.left_its_node(AllocationId("a")) and not view.left_its_node(AllocationId("b"))
    assert (view.node_of(AllocationId("b")), view.owned_by(b.owner)) == (NODE, "b")

    view.apply(NODE, NodeLedger(empty.node, (a, b)), 3)  # older than what the view holds: ignored
    assert view.node_of(AllocationId("a")) is None

    view.apply(NODE, None, 5)  # the node left
    assert (view.node_of(AllocationId("b")), view.owned_by(b.owner)) == (None, None)
    assert view.left_its_node(AllocationId("b"))


def test_the_allocations_that_left_their_node_are_remembered_newest_first(monkeypatch: Any) -> None:
    monkeypatch.setattr("gpuledger_allocator.view.GONE_KEPT", 3)
    view = ClusterView(_Store())  # type: ignore[arg-type]
    empty = ledger(8000)
    held = [allocation(f"x{i}", Grant("", (share(0, 100),))) for i in range(5)]
    for revision, one in enumerate(held, start=1):
        view.apply(NODE, NodeLedger(empty.node, (one,)), 2 * revision)
        view.apply(NODE, NodeLedger(empty.node, ()), 2 * revision + 1)  # gone from the key
    assert [view.left_its_node(AllocationId(f"x{i}")) for i in range(5)] == [False, False, True, True, True]
