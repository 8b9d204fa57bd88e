"""DRA mode: keeps the node's ResourceSlices equal to what the inventory knows (slices.py says what).

``poke()`` after every inventory publication; the loop builds the desired slices from the node's
state and writes only when they differ from what it last wrote, or every ``resync_s`` (kubelet
deletes its node's slices when it starts, and a driver's 30 s after the driver's kubelet plugin
went away). ``follow()`` watches the node's slices of the driver: one deleted by someone else is
written again at once (kube-scheduler can place no claim on the node while its slices are gone);
the resync mends what the watch missed (a deletion between two watches). A write reads the node's slices of the
driver first, so a restart (or another writer) is taken into account; a conflict reads again.
Every answer of the API server is checked against what was sent: a dropped field is logged as an
error naming it, counted, and the write is tried again later (an operator must turn the gate on).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

from gpuledger_core.errors import Conflict, GpuledgerError
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Health, MigSlot
from gpuledger_inventory import metrics
from gpuledger_inventory.kube import SliceApi
from gpuledger_inventory.slices import (
    CardFacts,
    Plan,
    SliceConfig,
    Slices,
    check_returned,
    desired,
    held_outside_dra,
    plan,
    tenancy_of,
)
from gpuledger_inventory.slices_mig import held_outside_dra as mig_held_outside_dra
from gpuledger_inventory.state import NodeState

log = logging.getLogger(__name__)
PcieRoot = Callable[[str], str | None]


def sysfs_pcie_root(bus_id: str, sysfs: str = "/sys") -> str | None:
    """The PCIe root complex of a card (``pci0000:00``), as the kernel's device tree links it; None
    where sysfs does not know the bus id (the fake fleet, a container without /sys)."""
    from gpuledger_inventory.slices import sysfs_bus_id

    bdf = sysfs_bus_id(bus_id)
    try:
        target = os.readlink(os.path.join(sysfs, "bus", "pci", "devices", bdf))
    except OSError:
        return None
    parts = [p for p in target.split("/") if p and p != ".."]
    if len(parts) < 2 or parts[0] != "devices" or not parts[1].startswith("pci"):
        return None
    return parts[1]


class SlicePublisher:
    def __init__(
        self,
        state: NodeState,
        api: SliceApi,
        config: SliceConfig,
        pcie_root: PcieRoot = sysfs_pcie_root,
        retry_s: float = 5.0,
        resync_s: float = 30.0,
    ) -> None:
        self.state, self.api, self.config = state, api, config
        self.pcie_root, self.retry_s, self.resync_s = pcie_root, retry_s, resync_s
        self.generation = 0  # the pool generation last written (0: none yet)
        self.last_error = ""
        self._poked = asyncio.Event()
        self._deleted = False  # the watch saw one of the node's slices deleted: write them again
        self.watching = False  # the watch of the slices is open (it has sent its first event)
        self._written: Slices | None = None
        self._owner: dict[str, Any] | None = None
        self._roots: dict[str, str | None] = {}
        self.held: dict[str, float] = {}  # card uuid -> since when pods or tools (not claims) hold some of it
        self.tenancy: dict[str, str] = {}  # card uuid -> the isolation tier of its holders (absent: idle)
        self.mig_held: dict[str, tuple[tuple[MigSlot, float], ...]] = {}  # card uuid -> its slots pods or tools hold

    def set_ledger(self, ledger: NodeLedger | None) -> None:
        """What the node's ledger says of its cards: those it gives to holders outside DRA are
        published with a NoSchedule taint, so that kube-scheduler allocates them to no new claim
        (the ledger would refuse it); every card's ``tenancy`` attribute says the isolation tier of
        its holders, which the DeviceClasses select on (an mps claim never meets a none tenant)."""
        held, tenancy, mig_held = held_outside_dra(ledger), tenancy_of(ledger), mig_held_outside_dra(ledger)
        if (held, tenancy, mig_held) != (self.held, self.tenancy, self.mig_held):
            self.held, self.tenancy, self.mig_held = held, tenancy, mig_held
            self.poke()

    def poke(self) -> None:
        self._poked.set()

    def wanted(self) -> Slices | None:
        """The slices for the node's current state; None before the first scan."""
        scan = self.state.scan
        if scan is None:
            return None
        facts: dict[str, CardFacts] = {}
        for info in scan.cards:
            health = self.state.book.of(info.uuid)
            since = health.since if health.health is Health.UNHEALTHY else None
            root = self._root(info.card.pci_bus_id)
            held, tenancy = self.held.get(info.uuid), self.tenancy.get(info.uuid, "idle")
            mig_held = self.mig_held.get(info.uuid, ())
            facts[info.uuid] = CardFacts(info.compute_capability, root, since, held, tenancy, mig_held)
        return desired(self.state.node(), facts, scan.driver_version, self.config)

    async def run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.resync_s):
                    await self._poked.wait()
                due = False
            except TimeoutError:
                due = True  # read the API server's slices again, whatever we wrote last
            self._poked.clear()
            due, self._deleted = due or self._deleted, False
            wanted = self.wanted()
            if wanted is None or (wanted == self._written and not due):
                continue
            try:
                await self.sync(wanted)
            except GpuledgerError as err:
                self.last_error = str(err)
                metrics.SLICE_ERRORS.inc()
                log.error("cannot publish the ResourceSlices of %s: %s", self.state.name, err)
                await asyncio.sleep(self.retry_s)
                self._poked.set()

    async def follow(self) -> None:
        """Watch the node's slices of the driver, and have a deleted one written again at once."""
        while True:
            try:
                async for event in self.api.watch_slices(self.state.name, self.config.driver):
                    self.watching = True
                    if event.get("type") == "DELETED":
                        name = (event.get("object") or {}).get("metadata", {}).get("name", "?")
                        log.info("ResourceSlice %s of %s was deleted: writing the slices again", name, self.state.name)
                        self._deleted = True
                        self.poke()
                self.watching = False
                await asyncio.sleep(1.0)  # the API server ended it (its timeout): watch again, never in a spin
            except GpuledgerError as err:
                self.watching = False
                log.warning("the watch of the ResourceSlices of %s broke: %s", self.state.name, err)
                await asyncio.sleep(self.retry_s)

    async def sync(self, wanted: Slices) -> Plan:
        """Write ``wanted``; a lost race (409) reads the slices again, up to three times."""
        for attempt in range(3):
            try:
                done = await self._sync_once(wanted)
            except Conflict:
                if attempt == 2:
                    raise
                continue
            self._written, self.last_error = wanted, ""
            return done
        raise AssertionError("unreachable")

    async def _sync_once(self, wanted: Slices) -> Plan:
        if self._owner is None:
            uid = await self.api.node_uid(self.state.name)
            self._owner = {"apiVersion": "v1", "kind": "Node", "name": self.state.name, "uid": uid}
        existing = await self.api.list_slices(self.state.name, self.config.driver)
        todo = plan(existing, wanted, self._owner, self.config.driver, self.generation)
        for body in todo.create:
            check_returned(body, await self.api.create_slice(body))
        for body in todo.update:
            check_returned(body, await self.api.replace_slice(body))
        for name in todo.delete:
            await self.api.delete_slice(name)
        self.generation = todo.generation
        if not todo.empty:
            metrics.SLICE_WRITES.inc()
            log.info(
                "ResourceSlices of %s at generation %d: %d created, %d replaced, %d deleted",
                self.state.name, todo.generation, len(todo.create), len(todo.update), len(todo.delete),
            )
        return todo

    def _root(self, bus_id: str) -> str | None:
        if not bus_id:
            return None
        if bus_id not in self._roots:
            self._roots[bus_id] = self.pcie_root(bus_id)
        return self._roots[bus_id]
