"""The node's ledger, as the plugin uses it: read, change with compare-and-set, watch.

The one adapter over ``gpuledger_common.store.LedgerStore``; tests may stand in with any object
of the ``NodeLedgerPort`` shape.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Protocol

from gpuledger_common.store import LedgerStore, Transition
from gpuledger_common.store.follow import node_ledger
from gpuledger_core.ledger import NodeLedger

log = logging.getLogger(__name__)


class NodeLedgerPort(Protocol):
    async def read(self) -> NodeLedger | None: ...

    async def mutate(self, transition: Transition) -> NodeLedger | None: ...

    def watch(self) -> AsyncGenerator[NodeLedger | None, None]: ...

    def answered_at(self) -> float:
        """``time.monotonic()`` when the ledger last answered a request, even "not now" (JetStream
        electing a leader says so at once; a server that is gone or frozen says nothing)."""
        ...


class StoreLedger:
    """One node's key in the ledger bucket."""

    def __init__(self, store: LedgerStore, node: str, retry_s: float = 1.0) -> None:
        self.store, self.node, self.retry_s = store, node, retry_s

    async def read(self) -> NodeLedger | None:
        ledger, _ = await self.store.read(self.node)
        return ledger

    async def mutate(self, transition: Transition) -> NodeLedger | None:
        return (await self.store.mutate(self.node, transition)).new

    def watch(self) -> AsyncGenerator[NodeLedger | None, None]:
        """The node's ledger now and after every change; watches again after NATS trouble."""
        return node_ledger(self.store, self.node, self.retry_s)

    def answered_at(self) -> float:
        return self.store.outage.answered_at
