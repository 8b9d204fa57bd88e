"""The fence preemption writes before its first eviction: what of the pod's planned room is free
now, no more (the victims' part stays theirs until the hold), on every card but MIG ones."""

from __future__ import annotations

import pytest

from gpuledger_core.errors import Exhausted
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, release, reserve
from gpuledger_core.model import CORE_WHOLE, AllocState, CardShare, Grant, OwnerKind
from gpuledger_core.room_fence import FENCE_TOOL, fence

from .builders import card, holding, node, share, whole
from .test_mig_ledger import instance_share, mig_card, mig_ledger
from .test_preemption import PREEMPTOR, pod

FENCE = AllocationId("f-1")


def fenced(ledger: NodeLedger, *grants: Grant) -> list[CardShare] | None:
    found = fence(ledger, pod(), grants, FENCE, 100.0, 60.0)
    if found is None:
        return None
    assert found.owner.kind is OwnerKind.TOOL and found.owner.id == f"{FENCE_TOOL}:{PREEMPTOR.key}"
    assert found.state is AllocState.RESERVED and found.lease_expires_at == 160.0
    return list(found.shares())


def test_the_fence_holds_the_free_part_of_a_shared_card_and_nothing_of_the_victims() -> None:
    ledger = NodeLedger(node(8000), (holding("victim", share(0, 3000, 300)), holding("stays", share(0, 2000, 200))))
    wanted = Grant("main", (share(0, 5000, 500),))  # 3000 MiB free now, 2000 more once the victim goes
    (part,) = fenced(ledger, wanted) or []
    assert (part.index, part.mem_mib, part.core_milli, part.exclusive) == (0, 3000, 500, False)
    wall = fence(ledger, pod(), (wanted,), FENCE, 100.0, 60.0)
    assert wall is not None
    walled = reserve(ledger, wall, mix_isolation=True)
    with pytest.raises(Exhausted, match="0 MiB free"):  # nobody takes the free part meanwhile
        reserve(walled, holding("other", share(0, 1000, 100)))
    after = release(release(walled, FENCE, 101.0), holding("victim").id, 101.0)
    assert reserve(after, holding("pod", share(0, 5000, 500))).get(holding("pod").id) is not None  # the hold


def test_a_free_card_is_fenced_as_the_pod_wants_it_and_a_card_only_victims_hold_whole_not_at_all() -> None:
    free, taken = card(0), card(1)
    ledger = NodeLedger(node(8000, 8000), (holding("victim", whole(taken)),))
    assert fenced(ledger, Grant("main", (whole(free), whole(taken)))) == [whole(free)]
    assert fenced(ledger, Grant("main", (whole(taken),))) is None  # all of it is the victim's
    partly = NodeLedger(node(8000), (holding("victim", share(0, 6000, 400)),))
    (rest,) = fenced(partly, Grant("main", (whole(card(0)),))) or []  # a whole card: all that is free
    assert (rest.mem_mib, rest.core_milli, rest.exclusive) == (2000, CORE_WHOLE - 400, False)


def test_the_free_slices_of_a_mig_placement_are_fenced_by_placements_nobody_else_can_take_beside() -> None:
    c = mig_card()
    ledger = reserve(mig_ledger(c), holding("victim", instance_share(c, "1g.10gb", 4)))  # slices 4-5
    wanted = Grant("main", (instance_share(c, "7g.40gb", 0),))  # slices 0-7: 0-3 and 6-7 free now
    found = fenced(ledger, wanted) or []
    slots = sorted((s.mig.start, s.mig.size) for s in found if s.mig is not None)
    assert len(found) == len(slots) and slots == [(0, 4), (6, 2)]  # the largest first: 0-3, then 6-7
    wall = fence(ledger, pod(), (wanted,), FENCE, 100.0, 60.0)
    assert wall is not None
    walled = reserve(ledger, wall, mix_isolation=True)
    for profile, start in (("1g.5gb", 0), ("2g.10gb", 2), ("1g.5gb", 6), ("1g.10gb", 6)):
        with pytest.raises(Exhausted, match="which is held"):
            reserve(walled, holding("other", instance_share(c, profile, start)))
    after = release(release(walled, FENCE, 101.0), holding("victim").id, 101.0)
    assert reserve(after, holding("pod", instance_share(c, "7g.40gb", 0))).get(holding("pod").id) is not None


def test_a_mig_placement_its_victims_hold_all_of_is_not_fenced() -> None:
    c = mig_card()
    ledger = reserve(mig_ledger(c), holding("victim", instance_share(c, "4g.20gb", 0)))
    assert fenced(ledger, Grant("main", (instance_share(c, "3g.20gb", 0),))) is None
