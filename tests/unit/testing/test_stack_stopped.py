"""A service task that does not stop fails the test with where each task was waiting."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import replicas as stack


async def _stuck_in_drain(forever: asyncio.Event) -> None:
    await forever.wait()


async def _service(forever: asyncio.Event) -> None:
    await _stuck_in_drain(forever)


async def test_a_task_that_stops_in_time_passes() -> None:
    await stack.stopped(asyncio.create_task(asyncio.sleep(0.01)), "quick")


async def test_a_task_that_does_not_stop_is_named_with_where_it_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack, "STOP_S", 0.05)
    task = asyncio.create_task(_service(asyncio.Event()), name="the-service")
    with pytest.raises(TimeoutError) as raised:
        await stack.stopped(task, "the allocator")
    text = str(raised.value)
    assert "the allocator did not stop within 0.05s" in text
    assert "the-service: _service (test_stack_stopped.py:17) -> _stuck_in_drain (test_stack_stopped.py:13)" in text
    assert task.cancelled()


async def test_a_task_that_fails_raises_its_error() -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await stack.stopped(asyncio.create_task(broken()), "broken")
