"""Work that waits for a request's answer (``bus.after_reply``): the ledger's events."""

from __future__ import annotations

import asyncio

from gpuledger_common import bus


def test_outside_a_request_nothing_waits() -> None:
    assert bus.after_reply(lambda: None) is False


def test_work_waits_for_the_answer_then_runs_in_order() -> None:
    done: list[str] = []
    with bus.answering() as replied:
        assert bus.after_reply(lambda: done.append("first"))
        assert bus.after_reply(lambda: done.append("second"))
        assert done == []
        replied()
        assert done == ["first", "second"]
        assert bus.after_reply(lambda: done.append("late")) is False  # answered: nothing waits any more
    assert done == ["first", "second"]


def test_work_runs_on_the_way_out_when_no_answer_was_sent() -> None:
    done: list[str] = []
    try:
        with bus.answering():
            bus.after_reply(lambda: done.append("kept"))
            raise RuntimeError("the handler failed")
    except RuntimeError:
        pass
    assert done == ["kept"]


def test_a_failing_follow_up_keeps_no_other_back() -> None:
    done: list[str] = []

    def fails() -> None:
        raise ValueError("boom")

    with bus.answering():
        bus.after_reply(fails)
        bus.after_reply(lambda: done.append("ran"))
    assert done == ["ran"]


async def test_tasks_the_handler_starts_share_its_wait() -> None:
    done: list[str] = []

    async def worker() -> bool:
        return bus.after_reply(lambda: done.append("from a task"))

    with bus.answering() as replied:
        assert await asyncio.create_task(worker())
        assert done == []
        replied()
    assert done == ["from a task"]
