"""The fence: the part of a preemption's room that is free already is held from before the first
eviction until the hold, so that no pod takes it while the victims are evicted; where it is taken
before the fence, nobody is evicted. An API double and a store double over the view's ledger."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpuledger_common.store import LedgerStore
from gpuledger_common.store.writes import Transition, Written
from gpuledger_core.errors import Exhausted, Unavailable
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, CardShare, Grant, Owner, OwnerKind
from gpuledger_core.room_fence import FENCE_TOOL
from gpuledger_placement.convert import pod_ask_from
from gpuledger_placement.preemption_note import PREEMPTION_ANNOTATION
from gpuledger_placement.preemptor import Preemptor
from gpuledger_placement.view import FleetView
from tests.unit.placement_service.test_preemptor_claims import FULL, NODE, Api, Store, high, world

# card 0 (7611 MiB): a mode-C 4 GiB claim (the victim) and a mirrored 2 GiB one (never a victim),
# 1467 MiB free; card 1 nearly full with a mirrored claim. A 5 GiB pod needs card 0's free part too.
HOLDERS = [("c1", 0, 4096, "C"), ("a", 0, 2048, "A"), ("x", 1, 7000, "A")]


def ledger(preemptor: Preemptor) -> NodeLedger:
    return preemptor.service.view.entries[NODE].ledger


def other(ledger: NodeLedger, mib: int) -> Allocation:
    """Another pod, bound into card 0 beside the victims."""
    c = ledger.node.cards[0]
    owner = Owner(OwnerKind.POD, "other-uid", "team", "other")
    return Allocation(AllocationId("other"), owner, NODE, (Grant("c", (CardShare(c.uuid, 0, mib, 10),)),))


def fences(ledger: NodeLedger) -> list[Allocation]:
    return [a for a in ledger.allocations if a.owner.kind is OwnerKind.TOOL and a.owner.id.startswith(FENCE_TOOL)]


async def test_the_free_part_of_the_room_is_fenced_while_the_victims_are_evicted() -> None:
    api, preemptor = world(HOLDERS)
    seen: list[str] = []

    class Evicting(Api):
        async def create_object(self, path: str, body: Any) -> dict[str, Any]:
            if not path.endswith("/eviction"):
                return await super().create_object(path, body)
            now = ledger(preemptor)
            (wall,) = [a for a in fences(now) if a.live]
            seen.append(f"fence {[(s.index, s.mem_mib) for s in wall.shares()]}")
            with pytest.raises(Exhausted, match="0 MiB free"):
                reserve(now, other(now, 1024))
            return await super().create_object(path, body)

    api.__class__ = Evicting
    raw = high(api)
    victims = await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)])
    assert victims is not None and [a.owner.id for a in victims.evict] == ["claim-c1"]
    assert seen == ["fence [(0, 1467)]"] and api.calls == ["evict c1"]
    after = ledger(preemptor)
    hold = after.of_owner("pod:high-uid")
    assert hold is not None and [s.index for s in hold.shares()] == [0]
    (wall,) = fences(after)
    assert not wall.live and wall.reason == "room held for pod team/high"  # released in the hold's write


async def test_room_taken_before_the_fence_evicts_nobody() -> None:
    api, preemptor = world(HOLDERS)

    class Racing(Api):
        async def patch_object(self, path: str, body: Any, content_type: str) -> dict[str, Any]:
            now = ledger(preemptor)
            if now.of_owner("pod:other-uid") is None:  # bound into the free part as the pod is announced
                view = preemptor.service.view
                view.apply(NODE, reserve(now, other(now, 1467)), view.entries[NODE].revision + 1)
            return await super().patch_object(path, body, content_type)

    api.__class__ = Racing
    raw = high(api)
    assert await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)]) is None
    assert api.calls == []  # the victim goes on: it would have gone for nothing
    assert ledger(preemptor).of_owner("claim:claim-c1") is not None and not fences(ledger(preemptor))
    annotations = api.items["/api/v1/namespaces/team/pods/high"]["metadata"].get("annotations") or {}
    assert annotations.get(PREEMPTION_ANNOTATION) is None  # withdrawn


class Failing(Store):
    """The store double, refusing the writes whose number (from 1) is in ``fail``."""

    def __init__(self, view: FleetView, fail: set[int]) -> None:
        super().__init__(view)
        self.fail, self.writes = fail, 0

    async def mutate(self, node: str, transition: Transition, attempts: int | None = None) -> Written:
        self.writes += 1
        if self.writes in self.fail:
            raise Unavailable("the ledger's store is away")
        return await super().mutate(node, transition, attempts)


async def test_a_fence_that_cannot_be_written_evicts_nobody_and_writes_the_veto_back() -> None:
    api, preemptor = world(FULL)
    preemptor.store = cast(LedgerStore, Failing(preemptor.service.view, {1}))
    raw = high(api)
    assert await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)]) is None
    assert api.calls == ["status b", "status b"]  # vetoed, then written back: no eviction
    assert ledger(preemptor).of_owner("claim:claim-b") is not None


async def test_a_hold_that_fails_releases_the_fence() -> None:
    api, preemptor = world(HOLDERS)
    preemptor.store = cast(LedgerStore, Failing(preemptor.service.view, {2}))  # the fence, then the hold
    raw = high(api)
    with pytest.raises(Unavailable):
        await preemptor.preempt(raw, pod_ask_from(raw), [str(NODE)])
    assert api.calls == ["evict c1"]
    (wall,) = fences(ledger(preemptor))
    assert not wall.live and wall.reason == "preemption given up"
