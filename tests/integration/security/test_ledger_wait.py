"""A node agent started before the allocator has made the ledger buckets (it may not make them)
waits for them instead of exiting, and opens the ledger once the allocator has; told to stop while
waiting, it stops. A real nats-server with a user per role, as deployed."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gpuledger_common import bus
from gpuledger_common.natsauth import Role
from gpuledger_common.store import LedgerStore
from gpuledger_common.store.ledgerwait import open_ledger
from gpuledger_core.errors import Unavailable
from gpuledger_dev.secure_nats import secure_nats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_plugin_waits_for_the_buckets_and_opens_them_once_they_exist() -> None:
    async with secure_nats(["node-a"]) as server:
        plugin = await bus.connect(server.url, "plugin", credentials=server.credentials(Role.PLUGIN, "node-a"))
        allocator = await bus.connect(server.url, "allocator", credentials=server.credentials(Role.ALLOCATOR))
        try:
            with pytest.raises(Unavailable):  # what made the plugin exit before: one window, then up
                await LedgerStore.open(plugin, retry_s=1.0)
            waiting = asyncio.create_task(open_ledger(plugin, asyncio.Event(), retry_s=1.0))
            await asyncio.sleep(3)
            assert not waiting.done()  # still waiting, not failed
            await LedgerStore.open(allocator, deny_rollups=True)  # the allocator makes the buckets
            store = await asyncio.wait_for(waiting, 20)
            assert await store.read("node-a") == (None, 0)
        finally:
            for nc in (plugin, allocator):
                with contextlib.suppress(Exception):
                    await nc.drain()


async def test_told_to_stop_while_waiting_it_stops() -> None:
    async with secure_nats(["node-a"]) as server:
        plugin = await bus.connect(server.url, "plugin", credentials=server.credentials(Role.PLUGIN, "node-a"))
        try:
            stop = asyncio.Event()
            waiting = asyncio.create_task(open_ledger(plugin, stop, retry_s=1.0))
            await asyncio.sleep(1.5)
            stop.set()
            with pytest.raises(Unavailable):
                await asyncio.wait_for(waiting, 10)
        finally:
            with contextlib.suppress(Exception):
                await plugin.drain()
