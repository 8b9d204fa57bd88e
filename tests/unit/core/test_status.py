from __future__ import annotations

from dataclasses import replace

from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import commit, release, reserve
from gpuledger_core.model import AllocState, Grant
from gpuledger_core.status import Holder, node_status

from .builders import NODE, allocation, card, ledger, node, share, whole


def test_node_status_shows_free_room_and_holders_per_card() -> None:
    state = ledger(8000, 4000, 2000)
    pod = allocation("a", Grant("train", (share(0, 3000, 250),)), lease=30.0, created_at=5.0)
    state = reserve(state, pod)
    state = reserve(state, allocation("b", Grant("", (whole(card(1, 4000)),)), created_at=6.0))
    state = commit(state, AllocationId("b"), now=7.0)
    status = node_status(state, stale=True, revision=12)
    assert (status.name, status.stale, status.revision) == (NODE, True, 12)
    assert [(c.card.index, c.free_mem_mib, c.free_core_milli) for c in status.cards] == [
        (0, 5000, 750),
        (1, 0, 0),
        (2, 2000, 1000),
    ]
    assert status.cards[0].holders == (Holder(pod.id, pod.owner, "train", 3000, 250, False, AllocState.RESERVED, 5.0),)
    (only,) = status.cards[1].holders
    assert (only.exclusive, only.state, only.mem_mib, only.since) == (True, AllocState.BOUND, 4000, 6.0)
    assert status.cards[2].holders == ()


def test_released_allocations_hold_nothing() -> None:
    state = reserve(ledger(8000), allocation("a", Grant("x", (share(0, 3000, 250),))))
    status = node_status(release(state, AllocationId("a"), now=1.0))
    assert [(c.free_mem_mib, c.free_core_milli, c.holders) for c in status.cards] == [(8000, 1000, ())]


def test_node_status_can_show_one_model() -> None:
    cards = (card(0, model="Tesla P4"), card(1, model="Tesla T4"), card(2, model="Tesla P4"))
    status = node_status(replace(ledger(), node=replace(node(), cards=cards)), model="Tesla P4")
    assert [c.card.index for c in status.cards] == [0, 2]
