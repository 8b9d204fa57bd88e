"""The device lists kubelet should have, one board per resource, each a stream of its versions.

``DeviceBoard`` holds one resource's list; ``MigBoards`` the MIG resources' (``mig_resources``): a
board for every MIG resource some card of the node offered since the plugin started. A resource no
card offers any more keeps its board with an empty list, so that kubelet sets its capacity to 0 at
once (a resource whose plugin goes away stays in the node's capacity, its devices unhealthy, for
kubelet's five-minute grace period) and lists the devices again the moment a card offers it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gpuledger_core.model import Node
from gpuledger_plugin.devices import HEALTHY, Advertised
from gpuledger_plugin.metrics import DEVICES, MIG_DEVICES
from gpuledger_plugin.mig_resources import device_lists


class DeviceBoard:
    """The device list kubelet should have for one resource, and a stream of every new version of
    it; ``gauge``: count its devices in ``gpuledger_plugin_devices`` (the gpu resource's)."""

    def __init__(self, gauge: bool = True) -> None:
        self.devices: tuple[Advertised, ...] = ()
        self.version = 0
        self.gauge = gauge
        self._changed = asyncio.Condition()

    async def publish(self, devices: tuple[Advertised, ...]) -> None:
        if devices == self.devices and self.version:
            return
        async with self._changed:
            self.devices, self.version = devices, self.version + 1
            self._changed.notify_all()
        if self.gauge:
            healthy = sum(1 for d in devices if d.health == HEALTHY)
            DEVICES.labels("healthy").set(healthy)
            DEVICES.labels("unhealthy").set(len(devices) - healthy)

    async def stream(self) -> AsyncIterator[tuple[Advertised, ...]]:
        seen = self.version
        yield self.devices
        while True:
            async with self._changed:
                while self.version == seen:
                    await self._changed.wait()
                seen, devices = self.version, self.devices
            yield devices


class MigBoards:
    """The MIG resources' boards; ``added`` is set whenever a resource gets its first board (the
    plugin then serves it and registers it with kubelet)."""

    def __init__(self, slots_per_card: int) -> None:
        self.slots_per_card = slots_per_card
        self.boards: dict[str, DeviceBoard] = {}
        self.added = asyncio.Event()

    async def publish(self, node: Node | None) -> None:
        lists = device_lists(node, self.slots_per_card)
        if not lists and not self.boards:
            return  # no card in MIG mode, now or before: nothing to do
        for name in lists:
            if name not in self.boards:
                self.boards[name] = DeviceBoard(gauge=False)
                self.added.set()
        for name, board in self.boards.items():
            devices = lists.get(name, ())
            await board.publish(devices)
            MIG_DEVICES.labels(name).set(len(devices))
