"""Short pauses of the garbage collector in services that hold the whole ledger in memory.

A full (generation 2) collection walks every object the collector tracks. A view of 5,000 nodes
of 8 cards holds about 250,000 of them, and on the shared 2-core development machine one full
collection stopped the event loop for 0.5-0.7 s; under 200 ledger writes a second the collector
starts one every few seconds (each write's decoded value survives into the old generation).
After each full collection the survivors are moved out of the collector's reach
(``gc.freeze``), so the next one walks only what was made since. Frozen objects are still freed
by reference counting as ever (ledger values hold no reference cycles); to keep cycles among
them from piling up, every ``THOROUGH_S`` the frozen objects are collected once (one long pause
every 10 minutes instead of one every few seconds).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

THOROUGH_S = 600.0


def _refreeze(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def install() -> None:
    """Freeze the survivors of every full collection from now on."""
    if _refreeze not in gc.callbacks:
        gc.callbacks.append(_refreeze)


def uninstall() -> None:
    if _refreeze in gc.callbacks:
        gc.callbacks.remove(_refreeze)


def thorough() -> int:
    """Collect everything once, the frozen objects too, then freeze the survivors; how many
    unreachable objects were found."""
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found


async def collect_thoroughly(interval_s: float = THOROUGH_S) -> None:
    """``thorough`` every ``interval_s``, until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        thorough()
