"""The device health kubelet should see, kept in step with the node's ledger, as a stream.

``HealthBoard`` holds the health of every device of the pool (``health.devices_of``) and hands
each watcher (a ``NodeWatchResources`` stream of kubelet) the whole list at once, again whenever it
changes, and again every ``resend_s`` though nothing changed: kubelet counts a device's health as
Unknown once it has not been reported for the timeout the plugin gives with it (30 s unless it
says otherwise), so an unchanged list must be said again well within it. ``follow`` feeds the
board from the node's ledger watch.

Without the ledger (``ledger_check`` off: no NATS) the board stays empty: the plugin knows nothing
of the cards' health, and kubelet shows the devices' health as Unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from gpuledger_core.ledger import NodeLedger
from gpuledger_plugin.dra.health import DeviceHealth, devices_of


class HealthBoard:
    def __init__(self) -> None:
        self.devices: tuple[DeviceHealth, ...] = ()
        self.version = 0
        self.watchers = 0
        self._changed = asyncio.Condition()

    async def publish(self, devices: tuple[DeviceHealth, ...]) -> None:
        """``devices`` are the pool's now; watchers hear of it only when something changed."""
        if devices == self.devices:
            return
        async with self._changed:
            self.devices, self.version = devices, self.version + 1
            self._changed.notify_all()

    async def stream(self, resend_s: float) -> AsyncGenerator[tuple[DeviceHealth, ...], None]:
        """The list now, then after every change, and every ``resend_s`` between; for ever
        (``watchers`` counts the streams open)."""
        self.watchers += 1
        try:
            seen = self.version
            yield self.devices
            while True:
                async with self._changed:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(resend_s):
                            while self.version == seen:
                                await self._changed.wait()
                    seen, devices = self.version, self.devices
                yield devices
        finally:
            self.watchers -= 1


async def follow(board: HealthBoard, ledgers: AsyncGenerator[NodeLedger | None, None]) -> None:
    """Publish the node's devices' health for every ledger the watch brings (none: no devices);
    the watch is closed when this ends."""
    async with contextlib.aclosing(ledgers):
        async for ledger in ledgers:
            await board.publish(devices_of(ledger.node if ledger is not None else None))
