"""Waiting on a condition in tests and benchmarks: poll it, never sleep for timing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gpuledger_common import tasks

T = TypeVar("T")


async def wait_for(
    check: Callable[[], Awaitable[T | None]], timeout: float = 10.0, what: str = "condition", interval: float = 0.02
) -> T:
    """Await ``check()`` every ``interval`` seconds until it returns something truthy, and return that.
    An exception from ``check`` means "not ready yet"; the last one is named if time runs out. A
    check that does not return is cut off at the deadline: the wait never outlasts ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Exception | None = None
    while loop.time() < deadline:
        limit = asyncio.timeout_at(deadline)
        try:
            async with limit:
                result = await check()
            if result:
                return result
        except Exception as err:  # not ready yet (or, past the deadline, still running)
            last = TimeoutError("a check was still running at the deadline") if limit.expired() else err
        await asyncio.sleep(interval)
    raise TimeoutError(f"{what} not reached within {timeout:g}s (last error: {last})")


def polled(check: Callable[[], object]) -> Callable[[], Awaitable[bool]]:
    """A plain condition (a flag, a counter, a list) as the awaitable check ``wait_for`` polls."""

    async def checked() -> bool:
        return bool(check())

    return checked



async def cancelled(task: asyncio.Task[object], what: str, within: float = 10.0) -> None:
    """Cancel ``task`` until it has ended (``gpuledger_common.tasks``: one cancel can be lost) and
    raise its error if it failed; a task still running after ``within`` seconds fails the test."""
    if not await tasks.cancelled(task, within):
        raise TimeoutError(f"{what} still ran {within:g}s after it was cancelled")
    error = None if task.cancelled() else task.exception()
    if error is not None:
        raise error
