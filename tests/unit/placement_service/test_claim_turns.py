"""Mode C tries pods of higher priority first (``claim_turns``): on its own, and in the allocator
when one change wakes pods of several priorities that wait for room, or finds the highest of them
in their back-off."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import pytest

from gpuledger_placement import claim_allocator
from gpuledger_placement.claim_allocator import ClaimAllocator
from gpuledger_placement.claim_cache import ClaimCache
from gpuledger_placement.claim_pods import GATE
from gpuledger_placement.claim_turns import FIRST_IN_LINE, Turns, first_in_line


async def _returned(turns: Turns, key: str, priority: int) -> asyncio.Task[None]:
    task = asyncio.ensure_future(turns.wait(key, priority))
    await asyncio.sleep(0.02)
    return task


async def test_a_try_waits_while_one_of_higher_priority_is_under_way_and_not_for_its_peers() -> None:
    turns = Turns(limit_s=5.0)
    await turns.wait("high", 100)
    assert (await _returned(turns, "peer", 100)).done()  # the same priority: at once
    low = await _returned(turns, "low", 0)
    assert not low.done()
    turns.end("high")
    await asyncio.sleep(0.01)
    assert not low.done()  # "peer" is still under way
    turns.end("peer")
    await asyncio.wait_for(low, 1.0)
    assert not (await _returned(turns, "lower", -5)).done()  # "low" itself is under way until it ends


async def test_a_try_waits_at_most_the_limit_for_one_that_hangs() -> None:
    turns = Turns(limit_s=0.1)
    turns.begin("high", 1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(turns.wait("low", 0), 1.0)
    assert 0.09 < loop.time() - started < 0.5


class _View:
    def __init__(self) -> None:
        self.listeners: list[Callable[[str], None]] = []

    def watch(self, listener: Callable[[str], None]) -> None:
        self.listeners.append(listener)


def _pod(uid: str, priority: int, created: str = "2026-12-07T05:00:00Z") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": uid, "uid": uid, "creationTimestamp": created},
        "spec": {"priority": priority, "schedulingGates": [{"name": GATE}]},
    }


def _waiting_allocator(monkeypatch: pytest.MonkeyPatch) -> tuple[_View, ClaimAllocator, list[tuple[str, str]]]:
    """An allocator whose pods find no room on their first try and room on every later one (the
    tries' starts and ends recorded); a high-priority pod's read comes back last."""
    view = _View()
    claims = type("Claims", (), {"cache": ClaimCache(), "allocating": set(), "driver": "gpu.gpuledger.io"})()
    allocator = ClaimAllocator(api=cast(Any, None), claims=cast(Any, claims), view=cast(Any, view),
                               policy=cast(Any, None), retry_s=30.0)  # fmt: skip
    tries: Counter[str] = Counter()
    seen: list[tuple[str, str]] = []

    async def settle(self: ClaimAllocator, pod: Any) -> bool:
        uid = pod["metadata"]["uid"]
        tries[uid] += 1
        if tries[uid] == 1:
            return False  # no room yet
        seen.append(("start", uid))
        await asyncio.sleep(0.05)  # the compare-and-set and the claim's write
        seen.append(("end", uid))
        return True

    async def fresh(self: ClaimAllocator, pod: Any) -> Any:
        await asyncio.sleep(0.05 if pod["spec"]["priority"] else 0.005)
        return pod

    monkeypatch.setattr(ClaimAllocator, "settle", settle)
    monkeypatch.setattr(ClaimAllocator, "_fresh", fresh)
    return view, allocator, seen


async def test_pods_woken_by_one_change_are_tried_highest_priority_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five low-priority pods and one high-priority pod (offered last) wait for room; a card is
    freed: the high-priority pod's try runs to its end before any other starts, even though its
    read of the pod comes back last."""
    monkeypatch.setattr(claim_allocator, "CHANGE_RETRY_S", 0.01)
    view, allocator, seen = _waiting_allocator(monkeypatch)
    low = [f"low-{i}" for i in range(5)]
    for uid in low:
        allocator.offer(_pod(uid, 0))
    allocator.offer(_pod("high", 1000))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if allocator._on_change == {*low, "high"}:
            break
    assert allocator._on_change == {*low, "high"}  # all tried once, past their back-off
    view.listeners[0]("n1")
    await asyncio.wait_for(allocator.idle(), 5.0)
    assert seen[:2] == [("start", "high"), ("end", "high")]
    assert sorted(uid for what, uid in seen[2:] if what == "start") == low


async def test_a_change_wakes_the_highest_priority_pods_in_their_back_off_and_nobody_else_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every pod is in its back-off (10 s) when a card is freed: the high-priority pod tries at
    once and takes it; the low-priority pods go on waiting for their back-off."""
    monkeypatch.setattr(claim_allocator, "CHANGE_RETRY_S", 10.0)
    view, allocator, seen = _waiting_allocator(monkeypatch)
    for i in range(3):
        allocator.offer(_pod(f"low-{i}", 0))
    allocator.offer(_pod("high", 1000))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(allocator._waiting) == 4:
            break
    assert set(allocator._waiting) == {"low-0", "low-1", "low-2", "high"} and allocator._on_change == set()
    view.listeners[0]("n1")
    await asyncio.wait_for(allocator._busy["high"], 2.0)
    await asyncio.sleep(0.1)
    assert seen == [("start", "high"), ("end", "high")]
    assert set(allocator._waiting) == {"low-0", "low-1", "low-2"}
    for task in allocator._busy.values():
        task.cancel()


def test_first_in_line_is_the_oldest_pods_of_the_highest_priority_where_priorities_differ() -> None:
    same = {f"p{i}": _pod(f"p{i}", 5) for i in range(3)}
    assert first_in_line(same, same) == []  # a burst of one priority: back-off as usual
    pods = {f"h{i:02}": _pod(f"h{i:02}", 7, f"2026-12-07T05:00:{59 - i:02}Z") for i in range(FIRST_IN_LINE + 2)}
    pods |= {"low": _pod("low", 0, "2026-12-07T04:00:00Z"), "none": {"metadata": {"uid": "none"}, "spec": {}}}
    oldest = [f"h{i:02}" for i in range(FIRST_IN_LINE + 1, 1, -1)]
    assert first_in_line([*pods, "gone"], pods) == oldest
