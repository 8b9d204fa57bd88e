"""Open the ledger store, waiting for it: a service started before the allocator has made the
buckets (the node agents and placement may not create them), or while JetStream is away, keeps
trying, and says so, until the store opens or the service is told to stop. Exiting instead would
leave a node without its plugin until something restarts it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from nats.aio.client import Client

from gpuledger_common.store.ledgerstore import LedgerStore
from gpuledger_core.errors import Unavailable

log = logging.getLogger(__name__)
FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 5.0


async def open_ledger(nc: Client, stop: asyncio.Event | None, **options: Any) -> LedgerStore:
    """``LedgerStore.open(nc, **options)`` tried again after each ``Unavailable``, pausing a little
    longer each time (up to 5 s); ``Unavailable`` once ``stop`` is set."""
    pause = FIRST_PAUSE_S
    while True:
        try:
            return await LedgerStore.open(nc, **options)
        except Unavailable as err:
            if stop is not None and stop.is_set():
                raise
            log.warning("the ledger does not open yet (trying again in %.1fs): %s", pause, err)
        await _pause(stop, pause)
        if stop is not None and stop.is_set():
            raise Unavailable("stopped before the ledger could be opened")
        pause = min(pause * 2, LONGEST_PAUSE_S)


async def _pause(stop: asyncio.Event | None, seconds: float) -> None:
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
