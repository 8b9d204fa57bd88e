"""A task is ended even when one cancel is lost, as ``asyncio.wait_for`` loses it on Python 3.11
when the awaited future finished in the same turn (``gpuledger_common.tasks``); the tests' wrapper
names a task that does not end and raises the error of one that failed."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

import pytest

from gpuledger_common import tasks
from gpuledger_common.store.follow import _Pump
from tests.support.waiting import cancelled


async def _writes_forever(answers: asyncio.Queue[asyncio.Future[int]], done: list[int]) -> None:
    """As a loop of NATS requests: each answer awaited through ``asyncio.wait_for``."""
    while True:
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        answers.put_nowait(answer)
        done.append(await asyncio.wait_for(answer, 5))


async def _answer_and_cancel_in_one_turn() -> tuple[asyncio.Task[None], list[int]]:
    answers: asyncio.Queue[asyncio.Future[int]] = asyncio.Queue()
    done: list[int] = []
    task = asyncio.create_task(_writes_forever(answers, done))
    answer = await answers.get()
    answer.set_result(1)  # the answer arrives and, before the writer runs again, the cancel
    task.cancel()
    return task, done


async def test_one_cancel_is_lost_by_wait_for_on_3_11() -> None:
    """Why ``cancelled`` exists: on Python 3.11 the writer goes on after one cancel. From 3.12 on
    (``wait_for`` rebuilt on ``asyncio.timeout``) that one cancel ends it, and the helper costs nothing."""
    task, done = await _answer_and_cancel_in_one_turn()
    await asyncio.sleep(0.05)
    if sys.version_info < (3, 12):
        assert not task.done() and done == [1]
        task.cancel()
    else:
        assert task.done() and done == []
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_writer_is_ended_although_a_cancel_was_lost() -> None:
    task, _ = await _answer_and_cancel_in_one_turn()
    assert await tasks.cancelled(task, within=2.0)
    assert task.cancelled()


async def test_a_task_that_ends_on_its_own_error_keeps_it_unread() -> None:
    async def failing() -> None:
        raise ValueError("broken")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    assert await tasks.cancelled(task)
    assert isinstance(task.exception(), ValueError)


async def test_a_task_that_never_ends_is_named() -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert not await tasks.cancelled(task, within=0.3)
    with pytest.raises(TimeoutError, match=r"the stubborn loop still ran 0\.3s after it was cancelled"):
        await cancelled(task, "the stubborn loop", within=0.3)
    released.set()
    task.cancel()
    await task


async def test_a_task_that_failed_raises_its_error() -> None:
    async def failing() -> None:
        raise ValueError("broken")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="broken"):
        await cancelled(task, "the failing task")


class _Connection:
    """What a pump reads of its NATS connection: the count of reconnects."""

    stats = {"reconnects": 0}


async def test_a_watch_that_loses_its_cancel_while_starting_is_still_closed() -> None:
    """A follower's watch is closed on every NATS reconnect; one that lost the cancel in its
    first request would otherwise run on beside the next, and the follower wait on it for ever."""
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asked = asyncio.Event()

    async def watch() -> AsyncIterator[int]:
        asked.set()
        yield await asyncio.wait_for(answer, 5)  # as the watch's first request to the server
        while True:
            await asyncio.sleep(0.01)
            yield 1

    pump = _Pump(_Connection(), watch, check_s=10.0)  # type: ignore[arg-type]
    await asked.wait()
    answer.set_result(0)
    closing = asyncio.ensure_future(pump.close())  # its cancel reaches the watch in the answer's turn
    done, _ = await asyncio.wait({closing}, timeout=2)  # not cancelled itself at the end of it
    ended = [task.done() for task in pump.tasks]
    if not done:
        await cancelled(closing, "the pump's close")
    assert closing in done and all(ended), ended


async def test_a_close_cancelled_itself_leaves_no_pump_task_running() -> None:
    """A service that fails to start cancels its follower twice (its task group, then its stop):
    the second cancel can reach the pump's close while it waits for a watch that takes a moment to
    end. Neither of the pump's tasks may be left running then (a watchdog was, for ever)."""
    started = asyncio.Event()

    async def watch() -> AsyncIterator[int]:
        started.set()
        try:
            await asyncio.Event().wait()
            yield 0
        finally:
            await asyncio.shield(asyncio.sleep(0.2))  # as a watch's clean-up: a NATS request

    pump = _Pump(_Connection(), watch, check_s=10.0)  # type: ignore[arg-type]
    await started.wait()
    closing = asyncio.ensure_future(pump.close())
    await asyncio.sleep(0.05)  # the close waits for the watch's clean-up
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    await asyncio.sleep(0.5)
    running = [task for task in pump.tasks if not task.done()]
    for task in running:
        await cancelled(task, "a pump task")
    assert not running, running
