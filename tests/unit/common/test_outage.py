"""Which failures are an outage, and how a call waits one out: retried with back-off within its
window (shared by everything the call does), then refused naming what and why."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, cast

import pytest
from nats.aio.client import Client
from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import (
    APIError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    ServiceUnavailableError,
)

from gpuledger_common.store.outage import Outage, OutageStats, outage_of, ride_out, time_left, within
from gpuledger_core.errors import Unavailable


@pytest.mark.parametrize(
    ("err", "kind"),
    [
        (NoRespondersError(), Outage.REFUSED),
        (NoStreamResponseError(), Outage.REFUSED),
        (ServiceUnavailableError(code=503, err_code=10008), Outage.REFUSED),
        (APIError(code=500, err_code=10009, description="JetStream cluster can not handle request"), Outage.REFUSED),
        (NatsTimeout(), Outage.UNKNOWN),
        (TimeoutError(), Outage.UNKNOWN),
        (ConnectionClosedError(), Outage.UNKNOWN),
        (KeyWrongLastSequenceError(), None),  # a lost race, not an outage
        (KeyNotFoundError(), None),
        (APIError(code=400, err_code=10005, description="no suitable peers for placement"), None),
        (ValueError("bad"), None),
    ],
)
def test_what_is_an_outage(err: Exception, kind: Outage | None) -> None:
    assert outage_of(err) is kind


@dataclass
class FakeClient:
    is_connected: bool = True
    is_closed: bool = False


def client(fake: FakeClient) -> Client:
    return cast(Client, fake)


class Failing:
    """Fails with ``errors`` in turn, then answers ``done``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls = list(errors), 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


async def test_an_outage_is_waited_out() -> None:
    stats = OutageStats()
    attempt = Failing(NoStreamResponseError(), NatsTimeout(), ServiceUnavailableError(code=503))
    assert await ride_out(client(FakeClient()), "write x", attempt, 5.0, stats) == "done"
    assert (attempt.calls, stats.retries, stats.ridden_out, stats.gave_up) == (4, 3, 1, 0)


async def test_answered_at_moves_with_every_answer_even_not_now_but_not_with_silence() -> None:
    """What the plugin tells an election (JetStream says "not now") from a server gone or frozen by."""
    stats = OutageStats()
    with pytest.raises(Unavailable):
        await ride_out(client(FakeClient()), "read x", Failing(*[NatsTimeout()] * 1000), 0.2, stats)
    assert stats.answered_at == float("-inf")  # timeouts only: nothing answered
    before = time.monotonic()
    with pytest.raises(Unavailable):
        await ride_out(client(FakeClient()), "read x", Failing(*[NoRespondersError()] * 1000), 0.2, stats)
    refused_at = stats.answered_at
    assert refused_at >= before  # "not now" is an answer
    with pytest.raises(Unavailable):
        await ride_out(client(FakeClient(is_connected=False)), "read x", Failing(), 0.2, stats)
    assert stats.answered_at == refused_at  # disconnected: nothing asked, nothing answered
    assert await ride_out(client(FakeClient()), "read x", Failing(), 0.2, stats) == "done"
    assert stats.answered_at > refused_at
    answered_at = stats.answered_at
    with pytest.raises(KeyNotFoundError):  # no outage, and an answer
        await ride_out(client(FakeClient()), "read x", Failing(KeyNotFoundError()), 0.2, stats)
    assert stats.answered_at > answered_at


async def test_a_conflict_is_raised_at_once() -> None:
    attempt = Failing(KeyWrongLastSequenceError())
    with pytest.raises(KeyWrongLastSequenceError):
        await ride_out(client(FakeClient()), "write x", attempt, 5.0)
    assert attempt.calls == 1


async def test_an_outage_longer_than_the_window_is_refused_naming_what_and_why() -> None:
    stats = OutageStats()
    attempt = Failing(*[NoStreamResponseError()] * 1000)
    started = time.monotonic()
    with pytest.raises(Unavailable) as refused:
        await ride_out(client(FakeClient()), "write the ledger of n1", attempt, 0.3, stats)
    assert 0.3 <= time.monotonic() - started < 1.0
    message = str(refused.value)
    assert message.startswith("cannot write the ledger of n1: JetStream did not take it within this request's 0.3s")
    assert "no stream leader answered" in message and "retry later" in message
    assert stats.gave_up == 1


async def test_nothing_is_sent_while_reconnecting() -> None:
    fake = FakeClient(is_connected=False)
    attempt = Failing()
    waiting = asyncio.ensure_future(ride_out(client(fake), "read x", attempt, 5.0))
    await asyncio.sleep(0.2)
    assert attempt.calls == 0 and not waiting.done()
    fake.is_connected = True
    assert await asyncio.wait_for(waiting, 2) == "done"
    assert attempt.calls == 1


async def test_while_reconnecting_the_refusal_says_so() -> None:
    with pytest.raises(Unavailable, match="NATS is disconnected"):
        await ride_out(client(FakeClient(is_connected=False)), "read x", Failing(), 0.2)


async def test_a_closed_connection_is_refused_at_once() -> None:
    with pytest.raises(Unavailable, match="connection is closed"):
        await ride_out(client(FakeClient(is_closed=True)), "read x", Failing(), 5.0)


async def test_a_request_with_no_answer_is_cut_off_at_the_end_of_the_window() -> None:
    async def silent() -> Any:
        await asyncio.sleep(30)

    started = time.monotonic()
    with pytest.raises(Unavailable, match="no answer in time"):
        await ride_out(client(FakeClient()), "read x", silent, 0.5)
    assert time.monotonic() - started < 1.2


async def test_the_calls_of_one_request_share_its_window() -> None:
    with within(0.4):
        with pytest.raises(Unavailable):
            await ride_out(client(FakeClient()), "write a", Failing(*[NoRespondersError()] * 1000), 10.0)
        assert time_left(10.0) == 0.0
        attempt = Failing(NoRespondersError())
        with pytest.raises(Unavailable):  # no time left: tried once, then refused
            await ride_out(client(FakeClient()), "write b", attempt, 10.0)
        assert attempt.calls == 1
    assert time_left(10.0) == 10.0


def test_an_inner_window_never_outlasts_the_outer_one() -> None:
    with within(1.0):
        with within(5.0):
            assert time_left(9.0) <= 1.0
        with within(0.5):
            assert time_left(9.0) <= 0.5
        assert 0.5 < time_left(9.0) <= 1.0
