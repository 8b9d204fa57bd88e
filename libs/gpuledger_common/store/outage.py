"""Riding out a JetStream outage: which failures mean "not now", and a bounded retry of them.

While a replicated stream elects a new leader (seconds, after the leader's server is lost),
while the client reconnects to another server of its list, or while the cluster has lost its
quorum, JetStream requests are answered with "no responders" or a 503, or not at all. A ledger
read or write that fails so is tried again with back-off until its window ends, and only then
refused as ``Unavailable``. Anything else (a compare-and-set conflict, a missing key) is not an
outage and is raised at once.

The window is per call, not per request to NATS: ``within(seconds)`` makes every ledger request
made inside it (also from tasks started inside it) share one deadline, so an Allocate that
writes three keys waits out an election once, and an edge that knows its caller's deadline
(gRPC) narrows the window to end before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from nats.aio.client import Client
from nats.errors import (
    ConnectionClosedError,
    ConnectionReconnectingError,
    NoRespondersError,
    OutboundBufferLimitError,
    StaleConnectionError,
)
from nats.js.errors import APIError, NoStreamResponseError

from gpuledger_common.metrics import OUTAGE_GAVE_UP, OUTAGE_RETRIES, OUTAGE_WAITED
from gpuledger_core.errors import Unavailable

T = TypeVar("T")
RETRY_S = 12.0  # the default window: an election after a crash took 4-10 s here (raft waits 4-9 s)
ATTEMPT_S = 2.0  # how long one JetStream request waits for its answer
MIN_ATTEMPT_S = 0.25  # ... at least, when the call's window is (nearly) over
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 0.5
CONNECTED_POLL_S = 0.05
# JetStream's "temporarily unavailable" (no meta leader) and "cluster can not handle request"
# (asked a server that is not the leader, during a change of leader).
UNAVAILABLE_CODES = frozenset({10008, 10009})

_window: ContextVar[tuple[float, float] | None] = ContextVar("gpuledger_outage_window", default=None)


class Outage(Enum):
    """How a request failed in an outage: ``REFUSED`` was certainly not applied; ``UNKNOWN``
    (no answer, or the connection went away after sending) may have been."""

    REFUSED = "refused"
    UNKNOWN = "unknown"


def outage_of(err: BaseException) -> Outage | None:
    """The kind of outage ``err`` shows, or None when it is no outage (a conflict, a bad request)."""
    if isinstance(err, NoRespondersError | NoStreamResponseError):
        return Outage.REFUSED
    if isinstance(err, APIError):  # some subclasses (KeyNotFoundError) set neither code
        code, err_code = getattr(err, "code", None), getattr(err, "err_code", None)
        return Outage.REFUSED if code == 503 or err_code in UNAVAILABLE_CODES else None
    if isinstance(err, TimeoutError):  # nats.errors.TimeoutError is one
        return Outage.UNKNOWN
    if isinstance(err, ConnectionClosedError | ConnectionReconnectingError):
        return Outage.UNKNOWN
    if isinstance(err, StaleConnectionError | OutboundBufferLimitError):
        return Outage.UNKNOWN
    return None


def describe(err: BaseException) -> str:
    if isinstance(err, NoRespondersError | NoStreamResponseError):
        return "no stream leader answered"
    if isinstance(err, TimeoutError):
        return "no answer in time"
    text = str(err).removeprefix("nats: ")
    return text or type(err).__name__


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Ledger requests made inside share one outage window ending ``seconds`` from now (an
    earlier end already set stays). With no time left, each request is still tried once."""
    now = time.monotonic()
    end = now + max(0.0, seconds)
    outer = _window.get()
    token = _window.set((now, end) if outer is None or end < outer[1] else outer)
    try:
        yield
    finally:
        _window.reset(token)


def time_left(window_s: float) -> float:
    """Seconds left in the current call's window (``window_s`` from now outside any)."""
    window = _window.get()
    return window_s if window is None else max(0.0, window[1] - time.monotonic())


def window_length(window_s: float) -> float:
    """How long the current call's window is, from its start (``window_s`` outside any)."""
    window = _window.get()
    return window_s if window is None else window[1] - window[0]


@dataclass(slots=True)
class OutageStats:
    retries: int = 0  # requests that failed in an outage and were tried again
    ridden_out: int = 0  # calls that succeeded after waiting out an outage
    gave_up: int = 0  # calls refused as unavailable after their window
    # time.monotonic() when JetStream last answered a request, even "not now" (a leader election
    # under way); a request that times out or finds NATS disconnected leaves it as it was
    answered_at: float = float("-inf")


async def ride_out(
    nc: Client,
    what: str,
    attempt: Callable[[], Awaitable[T]],
    window_s: float,
    stats: OutageStats | None = None,
) -> T:
    """``attempt()``, tried again while it fails in an outage (and while NATS is reconnecting),
    with back-off, until the call's window ends; then ``Unavailable`` saying what and why."""
    stats = stats if stats is not None else OutageStats()
    loop = asyncio.get_running_loop()
    end = loop.time() + time_left(window_s)
    started = loop.time()
    delay, reason = FIRST_BACKOFF_S, ""
    while True:
        if nc.is_closed:
            raise Unavailable(f"cannot {what}: the NATS connection is closed")
        if nc.is_connected:  # while reconnecting a request would only wait for its timeout
            try:
                async with asyncio.timeout(max(end - loop.time(), MIN_ATTEMPT_S)):
                    result = await attempt()
            except Exception as err:
                kind = outage_of(err)
                if kind is not Outage.UNKNOWN:  # a refusal, a conflict, a missing key: all answers
                    stats.answered_at = time.monotonic()
                if kind is None:
                    raise
                reason = describe(err)
            else:
                stats.answered_at = time.monotonic()
                if reason:
                    stats.ridden_out += 1
                    OUTAGE_WAITED.observe(loop.time() - started)
                return result
        else:
            reason = "NATS is disconnected (reconnecting to another server)"
        left = end - loop.time()
        if left <= 0:
            stats.gave_up += 1
            OUTAGE_GAVE_UP.inc()
            raise Unavailable(_refusal(what, reason, window_length(window_s)))
        stats.retries += 1
        OUTAGE_RETRIES.inc()
        pause = CONNECTED_POLL_S if not nc.is_connected else delay * random.uniform(0.5, 1.0)
        await asyncio.sleep(min(pause, left))
        delay = min(delay * 2, MAX_BACKOFF_S)


def _refusal(what: str, reason: str, window: float) -> str:
    return (
        f"cannot {what}: JetStream did not take it within this request's {window:.1f}s ({reason}); "
        "the NATS cluster is electing a leader or has lost the quorum of its servers; retry later"
    )
