"""Following the ledger bucket: every node's current value, then every change, for ever."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpuledger_common.store import LedgerStore
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger

log = logging.getLogger(__name__)
RETRY_S = 1.0
Apply = Callable[[NodeName, NodeLedger | None, int], None]


async def follow(store: LedgerStore, apply: Apply, caught_up: Callable[[], None], retry_s: float = RETRY_S) -> None:
    """Call ``apply`` for every value of every node's key; after a lost watch, start again from
    a fresh snapshot. ``caught_up`` is called each time a snapshot has been applied in full."""
    while True:
        try:
            async for node, ledger, revision in store.watch(caught_up=caught_up):
                apply(node, ledger, revision)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.warning("ledger watch lost (%s); resubscribing in %.0fs", err, retry_s)
        await asyncio.sleep(retry_s)
