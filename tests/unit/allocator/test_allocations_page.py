"""ListAllocations in pages: every allocation the filter matches once, in node and ID order,
whatever the page size; a token that no page gave is refused by name."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_allocator.queries import AllocationFilter, allocations_page
from gpuledger_allocator.view import ClusterView
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, AllocState, Grant
from tests.unit.core.builders import allocation, ledger, share


class _Store:
    def remember(self, *_: Any) -> None:
        pass


def a_view(per_node: list[int]) -> ClusterView:
    view = ClusterView(_Store())  # type: ignore[arg-type]
    for n, count in enumerate(per_node):
        name = NodeName(f"node-{n:02d}")
        held = tuple(
            allocation(
                f"a{n:02d}-{i:02d}",
                Grant("", (share(0, 10),)),
                state=AllocState.RELEASED if i % 3 == 2 else AllocState.BOUND,
                name=name,
            )
            for i in range(count)
        )
        node = ledger(8000).node
        view.apply(name, NodeLedger(type(node)(name, node.cards), held), n + 1)
    return view


def every_page(view: ClusterView, where: AllocationFilter, size: int) -> list[Allocation]:
    found: list[Allocation] = []
    token = ""
    for _ in range(1000):
        page, token = allocations_page(view, where, size, token)
        assert len(page) <= size
        found += page
        if not token:
            return found
        assert len(page) == size  # only a full page has a next one
    raise AssertionError("the pages never ended")


@settings(max_examples=60, deadline=None)
@given(per_node=st.lists(st.integers(0, 7), max_size=6), size=st.integers(1, 9), released=st.booleans())
def test_the_pages_hold_each_allocation_once_in_order(per_node: list[int], size: int, released: bool) -> None:
    view = a_view(per_node)
    where = AllocationFilter(include_released=released)
    expected = sorted(
        (a for ledger_ in view.ledgers.values() for a in ledger_.allocations if where.matches(a)),
        key=lambda a: (a.node, a.id),
    )
    assert every_page(view, where, size) == expected


def test_a_nodes_allocations_and_the_callers_own_page_alone() -> None:
    view = a_view([3, 4, 2])
    only = AllocationFilter(node="node-01", include_released=True)
    assert [a.id for a in every_page(view, only, 2)] == ["a01-00", "a01-01", "a01-02", "a01-03"]
    page, token = allocations_page(view, AllocationFilter(), 0, "", lambda a: a.id.endswith("-01"))
    assert ([a.id for a in page], token) == (["a00-01", "a01-01", "a02-01"], "")


def test_the_default_and_largest_pages() -> None:
    view = a_view([7] * 3)
    assert len(allocations_page(view, AllocationFilter(include_released=True), 0)[0]) == 21  # under the default
    with pytest.raises(InvalidArgument, match="page_size"):
        allocations_page(view, AllocationFilter(), -1)


@pytest.mark.parametrize("token", ["x", "!!!", "WzEsMl0=", "bnVsbA=="])
def test_a_token_no_page_gave_is_refused_by_name(token: str) -> None:
    with pytest.raises(InvalidArgument, match="page_token"):
        allocations_page(a_view([1]), AllocationFilter(), 1, token)
