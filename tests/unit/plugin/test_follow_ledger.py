"""The plugin's ledger watch ends with the loop that follows it: cancelled while it publishes the
device list (the watch waiting at its ``yield``), the loop closes the watch before it ends, so
the watch's tasks and its NATS consumer go with it, not when the garbage collector gets to it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import pytest

from gpuledger_core.ledger import NodeLedger
from gpuledger_plugin.answer import AnswerPolicy
from gpuledger_plugin.kubelet_findings import KubeletView
from gpuledger_plugin.preferred import LocalPlacement
from gpuledger_plugin.service import PluginService
from tests.support.waiting import polled, wait_for

from .plugin_fixtures import SLOTS, ledger_with

pytestmark = pytest.mark.timeout(5)


class WatchedLedger:
    def __init__(self) -> None:
        self.ledger = ledger_with()
        self.yielded = self.closed = False

    async def read(self) -> NodeLedger | None:
        return self.ledger

    async def watch(self) -> AsyncGenerator[NodeLedger | None, None]:
        try:
            self.yielded = True
            yield self.ledger
            await asyncio.Event().wait()  # no change ever comes
        finally:
            self.closed = True


class NoPods:
    async def list(self) -> KubeletView:
        return {}


async def test_a_follow_cancelled_while_it_publishes_closes_its_watch() -> None:
    ledger = WatchedLedger()
    service = PluginService("n1", ledger, LocalPlacement(), NoPods(), AnswerPolicy(), SLOTS)  # type: ignore[arg-type]
    async with service.board._changed:  # the device list is held: the first publish waits for it
        task = asyncio.create_task(service.follow_ledger())
        await wait_for(polled(lambda: ledger.yielded), what="the first ledger")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert ledger.closed
