"""How the plugin's kubelet calls wait for a ledger that is away (pure asyncio, no I/O of its own).

kubelet gives GetPreferredAllocation and Allocate no deadline and fails a pod for good on an error
from either, so both wait, reading again with back-off (``waiting``), as long as the outage is
worth waiting for (``patiently``): while JetStream answers "not now" (a leader election, a stream
leader without its quorum) up to the call's wait, and once the ledger has answered nothing at all
(servers gone or frozen) no longer than ``UNREACHABLE_WAIT_S``. Then the caller goes on from the
node's last known ledger (docs/pod-identity.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from gpuledger_core.errors import Conflict, Unavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

# GetPreferredAllocation waits this long for the ledger, then steers from the watch's copy: kubelet
# fails the pod on an error there, and the hint is checked by Allocate anyway.
PREFERRED_WAIT_S = 5.0
# Allocate waits this long for the ledger while a NATS server answers (a JetStream leader election
# after a crash took 4-10 s here), then admits a container whose reservation the watch already
# brought, and binds it once the ledger is back; kubelet fails a pod for good on an error.
ALLOCATE_WAIT_S = 12.0
# Both stop waiting once the ledger has answered nothing for this long, not even "not now" (as
# JetStream does while it elects a leader): a server that is gone or frozen will not answer soon.
# One request waits 2 s for its answer (``outage.ATTEMPT_S``).
UNREACHABLE_WAIT_S = 3.0
REACH_POLL_S = 0.1
OUTAGE_PAUSE_S, OUTAGE_PAUSE_MAX_S = 0.05, 1.0  # between tries of a ledger away or refusing writes


class NotNow(Unavailable):
    """The ledger did not answer while the call could wait for it (the reason in the message)."""


def pauses() -> Iterator[float]:
    """The pauses between tries of a ledger that is away: doubling, up to ``OUTAGE_PAUSE_MAX_S``."""
    pause = OUTAGE_PAUSE_S
    while True:
        yield pause
        pause = min(pause * 2, OUTAGE_PAUSE_MAX_S)


async def waiting(what: str, work: Callable[[], Awaitable[T]]) -> T:
    """``work()``, tried again after each of ``pauses`` while the ledger cannot be reached
    (``Unavailable``: NATS restarting, a leader election) or would not take the write
    (``Conflict``: a lost race, or a stream leader that has lost its quorum and refuses every
    write to the key while an earlier one is in flight). The caller bounds the wait."""
    for pause in pauses():
        try:
            return await work()
        except (Unavailable, Conflict) as err:
            log.info("%s waits for the ledger: %s", what, err)
        await asyncio.sleep(pause)
    raise AssertionError("unreachable")


async def patiently(
    what: str,
    work: Callable[[], Awaitable[T]],
    wait_s: float,
    unreachable_wait_s: float,
    answered_at: Callable[[], float],
) -> T:
    """``work()``, tried again while the ledger is away (``waiting``) for up to ``wait_s``, or
    ``NotNow`` saying why not: sooner once the ledger has answered nothing (``answered_at``: the
    ``time.monotonic()`` of its last answer) for ``unreachable_wait_s`` (a leader election is worth
    waiting for; a server gone or frozen, not)."""
    started = time.monotonic()
    task = asyncio.ensure_future(waiting(what, work))
    try:
        while True:
            await asyncio.wait({task}, timeout=REACH_POLL_S)
            if task.done():
                return task.result()
            now = time.monotonic()
            if now - started >= wait_s:
                said = "JetStream said not now: an election, a lost quorum"
                raise NotNow(f"the ledger did not answer within {wait_s:g}s ({said})")
            silent = now - max(started, answered_at())
            if silent >= unreachable_wait_s:
                raise NotNow(f"NATS has answered nothing for {silent:.1f}s (the ledger is unreachable)")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
