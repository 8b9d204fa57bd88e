"""The claim's status.allocation written from the ledger's allocation (gpuledger_core.claim_status):
what kube-scheduler would write, and the way back to the same ledger allocation (claims)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger_core import claims
from gpuledger_core.claim_status import allocation_status
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import NodeName
from gpuledger_core.model import CORE_WHOLE, Allocation, CardShare, Grant, Node
from tests.unit.core.builders import NODE, node

REF = ClaimRef("ns", "train", "uid-1")
DRIVER = "gpu.gpuledger.io"
STEP = 256


def ids() -> Any:
    counter = itertools.count()
    return lambda: f"00000000-0000-4000-8000-{next(counter):012d}"


def claim_with(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "train", "uid": "uid-1"}, "status": {"allocation": status}}


def back(status: dict[str, Any], cards: tuple[int, ...]) -> Any:
    return claims.ledger_allocation(REF, claims.results_of(claim_with(status), DRIVER), node(*cards), now=0.0)


def test_a_share_and_a_whole_card_as_kube_scheduler_writes_them() -> None:
    n = node(81559, 81559)
    shares = (CardShare(n.cards[0].uuid, 0, 10240, 250),)
    whole = (CardShare(n.cards[1].uuid, 1, 81559, CORE_WHOLE, exclusive=True),)
    allocation = back_allocation(n, (Grant("gpu", shares), Grant("aux", whole)))
    status = allocation_status(allocation, n, DRIVER, 1_700_000_000.0, shareable=True, share_id=ids())
    share, card = status["devices"]["results"]
    assert share == {
        "request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0",
        "shareID": "00000000-0000-4000-8000-000000000000",
        "consumedCapacity": {"memory": str(10240 << 20), "compute": "25", "slots": "1"},
    }  # fmt: skip
    assert card["device"] == "gpu-1" and card["request"] == "aux"
    whole_card = {"memory": str(81408 << 20), "compute": "100", "slots": "1"}  # the whole card as published
    assert card["consumedCapacity"] == whole_card
    assert "bindingConditions" not in share and "config" not in status["devices"]
    assert status["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
    }
    assert status["allocationTimestamp"] == "2023-11-14T22:13:20Z"
    assert back(status, (81559, 81559)).grants == allocation.grants  # read back as the ledger holds it


def back_allocation(n: Node, grants: tuple[Grant, ...]) -> Allocation:
    return Allocation(claims.allocation_id(REF, ()), REF.owner, n.name, grants)


def test_a_card_that_takes_one_allocation_has_no_share_and_no_capacity() -> None:
    n = node(16384)
    allocation = back_allocation(n, (Grant("gpu", (CardShare(n.cards[0].uuid, 0, 16384, CORE_WHOLE, True),)),))
    (result,) = allocation_status(allocation, n, DRIVER, 0.0, shareable=False)["devices"]["results"]
    assert result == {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    (share,) = back(allocation_status(allocation, n, DRIVER, 0.0, shareable=False), (16384,)).shares()
    assert share.exclusive and share.mem_mib == 16384


def test_a_first_available_choice_and_the_configs_are_written_as_given() -> None:
    n = node(16384)
    allocation = back_allocation(n, (Grant("gpu", (CardShare(n.cards[0].uuid, 0, 1000, 100),)),))
    config = {"source": "FromClass", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {}}}
    status = allocation_status(
        allocation, n, DRIVER, 0.0, shareable=True, chosen={"gpu": "gpu/small"}, configs=[config]
    )
    (result,) = status["devices"]["results"]
    assert result["request"] == "gpu/small"
    assert result["consumedCapacity"] == {"memory": str(1024 << 20), "compute": "10", "slots": "1"}  # on the grid
    assert status["devices"]["config"] == [config]


def test_an_allocation_of_another_node_or_without_cards_is_refused() -> None:
    n = node(16384)
    other = back_allocation(n, (Grant("gpu", (CardShare(n.cards[0].uuid, 0, 1000, 100),)),))
    with pytest.raises(InvalidArgument, match="is on elsewhere, not"):
        allocation_status(replace(other, node=NodeName("elsewhere")), n, DRIVER, 0.0, shareable=True)
    with pytest.raises(InvalidArgument, match="request 'gpu' holds no card"):
        allocation_status(back_allocation(n, (Grant("gpu", ()),)), n, DRIVER, 0.0, shareable=True)


@given(
    mems=st.lists(st.integers(1, 80000 // STEP), min_size=1, max_size=4),
    percents=st.lists(st.integers(1, 100), min_size=4, max_size=4),
)
def test_shares_on_the_grid_come_back_as_the_same_ledger_allocation(mems: list[int], percents: list[int]) -> None:
    """Written and read back through the claim, a ledger allocation whose shares lie on the
    slices' grid is the one it was (the way mode C commits exactly what the claim will say)."""
    cards = tuple(81559 for _ in mems)
    n = node(*cards)
    shares = tuple(
        CardShare(n.cards[i].uuid, i, m * STEP, p * 10) for i, (m, p) in enumerate(zip(mems, percents, strict=False))
    )
    first = back(allocation_status(back_allocation(n, (Grant("gpu", shares),)), n, DRIVER, 0.0, shareable=True,
                                   share_id=ids()), cards)  # fmt: skip
    again = back(allocation_status(first, n, DRIVER, 0.0, shareable=True, share_id=ids()), cards)
    assert again.grants == first.grants
    for share, written in zip(shares, first.shares(), strict=True):
        whole = share.mem_mib >= 81408 and share.core_milli >= CORE_WHOLE
        assert written.exclusive == whole
        if not whole:
            assert (written.mem_mib, written.core_milli) == (share.mem_mib, share.core_milli)
