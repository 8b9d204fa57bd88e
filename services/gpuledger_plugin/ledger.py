"""The node's ledger, as the plugin uses it: read, change with compare-and-set, watch.

The one adapter over ``gpuledger_common.store.LedgerStore``; tests may stand in with any object
of the ``NodeLedgerPort`` shape.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Protocol

from gpuledger_common.follow import resilient
from gpuledger_common.store import LedgerStore, Transition, node_key
from gpuledger_core.errors import Unavailable
from gpuledger_core.ledger import NodeLedger

log = logging.getLogger(__name__)


class NodeLedgerPort(Protocol):
    async def read(self) -> NodeLedger | None: ...

    async def mutate(self, transition: Transition) -> NodeLedger | None: ...

    def watch(self) -> AsyncIterator[NodeLedger | None]: ...


class StoreLedger:
    """One node's key in the ledger bucket."""

    def __init__(self, store: LedgerStore, node: str, retry_s: float = 1.0) -> None:
        self.store, self.node, self.retry_s = store, node, retry_s

    async def read(self) -> NodeLedger | None:
        ledger, _ = await self.store.read(self.node)
        return ledger

    async def mutate(self, transition: Transition) -> NodeLedger | None:
        return (await self.store.mutate(self.node, transition)).new

    async def watch(self) -> AsyncIterator[NodeLedger | None]:
        """The node's ledger now and after every change; watches again after NATS trouble."""
        async for ledger in resilient(self.store.nc, self._watch_once, self.retry_s):
            yield ledger

    async def _watch_once(self) -> AsyncIterator[NodeLedger | None]:
        try:
            watcher = await self.store.kv.watch(node_key(self.node))
        except Exception as err:
            raise Unavailable(f"cannot watch the ledger of {self.node}: {err}") from err
        try:
            async for entry in watcher:
                if entry is None:
                    continue
                yield self.store.watched_value(self.node, entry.value, entry.operation)
        except Exception as err:
            raise Unavailable(f"ledger watch of {self.node} failed: {err}") from err
        finally:
            try:
                await watcher.stop()  # type: ignore[no-untyped-call]
            except Exception as err:  # the connection may already be gone
                log.debug("stopping the ledger watcher: %s", err)
