"""What the remediation e2e tests and benchmark share (docs/remediation.md): a node of a running
stack whose inventory runs in this process with remediation on, so that a fault can be injected
into its fake NVML at the moment the caller chooses; and a sampler of the ledger that records,
throughout, every card over capacity, every holder that lands on a card under repair, and the
stages the watched card goes through with their times."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuledger_common import bus
from gpuledger_common.natscreds import NONE, NatsCredentials
from gpuledger_common.settings import load
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Health, Remedy
from gpuledger_dev.local_stack import Stack
from gpuledger_inventory.app import Running, build_gpus, serve
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.remediation import Stage, Step
from gpuledger_inventory.settings import InventorySettings
from tests.support.ledger_check import ledger_through_leader, over_capacity
from tests.support.waiting import wait_for

Read = Callable[[], Awaitable[Iterable[NodeLedger]]]
XID_FELL_OFF_THE_BUS = 79


@dataclass
class RepairingNode:
    """A node whose inventory runs in this process (remediating, as a rule); ``nvml`` is its fake NVML."""

    name: str
    running: Running
    nvml: Any

    async def fail(self, card: int, xid: int = XID_FELL_OFF_THE_BUS) -> float:
        """An XID on ``card`` as soon as the inventory reads NVML's events (an event set made after
        the event would never see it: after a start, and after a reset, it makes a new one); when it
        was injected (``time.time()``)."""
        waits = self.nvml.calls.get("nvmlEventSetWait", 0)

        async def reading() -> bool:
            return bool(self.nvml.calls.get("nvmlEventSetWait", 0) > waits)

        await wait_for(reading, 30, f"the inventory of {self.name} reading NVML's events", 0.05)
        self.nvml.inject_xid(card, xid)
        return time.time()

    def history(self, card: int) -> list[Step]:
        """The card's remediation so far, step by step (the inventory's book, wall-clock times)."""
        state = self.running.inventory.state
        scan = state.scan
        assert scan is not None, "the inventory has not scanned its cards yet"
        uuid = next(i.uuid for i in scan.cards if i.card.index == card)
        return list(state.remedies.of(uuid).history)

    def stage_at(self, card: int, stage: Stage, since: float) -> float | None:
        """When the card last entered ``stage`` at or after ``since`` (None: not yet)."""
        return next((s.at for s in reversed(self.history(card)) if s.at >= since and s.stage is stage), None)

    async def reached(self, card: int, stage: Stage, since: float, timeout: float = 120) -> float:
        """Wait until the card enters ``stage`` at or after ``since``; when it did."""

        async def check() -> float | None:
            return self.stage_at(card, stage, since)

        what = f"card {card} of {self.name} {stage} (history: {self.history(card)})"
        return await wait_for(check, timeout, what, 0.05)

    async def heal(self, card: int, note: str) -> None:
        """What an operator does with a retired card: returns it (``gpuledger health --healthy``)."""
        await self.running.inventory.set_health({"index": card, "healthy": True, "by": "e2e", "note": note})


@contextlib.asynccontextmanager
async def in_process(settings: InventorySettings) -> AsyncIterator[RepairingNode]:
    """The inventory of ``settings`` (on the fake NVML) served in this process until the block ends."""
    gpus, host = build_gpus(settings)
    assert isinstance(gpus, NvmlGpus), "not the fake NVML: set fake_fleet"
    stop = asyncio.Event()
    started: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(settings, gpus=gpus, host=host, stop=stop, on_started=started.set_result))
    try:
        running = await asyncio.wait_for(asyncio.shield(started), 30)
        yield RepairingNode(settings.node, running, gpus.nvml)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def remediating(stack: Stack, node: str, *flags: str) -> contextlib.AbstractAsyncContextManager[RepairingNode]:
    """The stack's inventory of ``node`` replaced, for the block, by the same one with ``--remediate``
    (and ``flags``) in this process; the stack's own process is started again afterwards."""
    return in_stack(stack, node, "--remediate", *flags)


@contextlib.asynccontextmanager
async def in_stack(stack: Stack, node: str, *flags: str) -> AsyncIterator[RepairingNode]:
    """The stack's inventory of ``node`` served in this process for the block, with ``flags`` more."""
    service = stack.supervisor.get(f"inventory-{node}")
    settings = load(InventorySettings, [*service.args, *flags])
    await service.stop()
    try:
        async with in_process(settings) as found:
            yield found
    finally:
        await service.start()


@contextlib.asynccontextmanager
async def ledger_reader(url: str, credentials: NatsCredentials = NONE) -> AsyncIterator[Read]:
    """Every node's ledger, read straight from JetStream over one connection kept open."""
    nc = await bus.connect(url, "remediation-check", credentials=credentials)

    async def read() -> Iterable[NodeLedger]:
        return (await ledger_through_leader(nc)).values()

    try:
        yield read
    finally:
        await nc.close()


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # time.time()
    health: Health
    remedy: Remedy
    holders: frozenset[str]  # the owners (kind:id) with a share of the card


@dataclass
class LedgerSampler:
    """Reads the ledger every ``interval`` seconds while running. ``findings``: a card over capacity
    anywhere, or a holder on the watched card (``node``, ``index``) that was not there when its
    repair began (one placed on it while its remedy is set). ``returned``: a holder that was there
    when the repair began, left, and was seen on the card again while its remedy was set (an
    evicted pod's entry shown again; kept apart: it is no placement on the card under repair)."""

    read: Read
    node: str
    index: int
    slots_per_card: int = 8
    interval: float = 0.2
    findings: list[str] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    _began: frozenset[str] = frozenset()  # the card's holders when its repair began
    _left: dict[str, str] = field(default_factory=dict)  # a holder that left: its entries then
    last_error: str = ""

    async def run(self) -> None:
        allowed: frozenset[str] = frozenset()
        while True:
            try:
                allowed = self._look(list(await self.read()), allowed)
            except Exception as err:  # a read refused for a moment is a sample missed
                self.last_error = repr(err)
            await asyncio.sleep(self.interval)

    def __str__(self) -> str:
        changes = [s for i, s in enumerate(self.samples) if i == 0 or _seen(s) != _seen(self.samples[i - 1])]
        told = "; ".join(f"{s.at:.1f} {s.health} {s.remedy or 'serving'} {len(s.holders)} holder(s)" for s in changes)
        return f"{len(self.samples)} sample(s), changes: {told}; last error: {self.last_error or 'none'}"

    def _look(self, ledgers: list[NodeLedger], allowed: frozenset[str]) -> frozenset[str]:
        self.findings.extend(f for f in over_capacity(ledgers, self.slots_per_card) if f not in self.findings)
        found = next((n for n in ledgers if n.node.name == self.node), None)
        if found is None:
            return allowed
        card = next(c for c in found.node.cards if c.index == self.index)
        holders = frozenset(a.owner.key for a in found.live() if any(s.index == self.index for s in a.shares()))
        self.samples.append(Sample(time.time(), card.health, card.remedy, holders))
        if card.remedy is Remedy.NONE:
            self._began = holders
            return holders
        for stranger in sorted(holders - self._began):
            self.findings.append(f"{stranger} placed on card {self.index} of {self.node} under repair ({card.remedy})")
        for back in sorted((holders & self._began) - allowed):
            self.returned.append(
                f"{back} seen again on card {self.index} of {self.node} after it left ({card.remedy}, {card.health}):"
                f" now {_entry(found, back)}; when it left {self._left.get(back, 'unknown')}"
            )
        for left in sorted(allowed - holders):
            self._left[left] = _entry(found, left)
        return allowed & holders

    def first(self, since: float, remedy: Remedy, health: Health | None = None) -> float | None:
        """When the card was first seen with ``remedy`` (and ``health``) at or after ``since``."""
        return next(
            (s.at for s in self.samples if s.at >= since and s.remedy is remedy and health in (None, s.health)),
            None,
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[LedgerSampler]:
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _entry(found: NodeLedger, owner: str) -> str:
    """The owner's entries in the node's ledger, as a reader can tell them apart."""
    entries = [
        f"{a.id} {a.state} cards {sorted({s.index for s in a.shares()})} updated {a.updated_at:.2f} {a.reason!r}"
        for a in found.allocations
        if a.owner.key == owner
    ]
    return "; ".join(entries) or "no entry"


def _seen(sample: Sample) -> tuple[Health, Remedy, frozenset[str]]:
    return sample.health, sample.remedy, sample.holders


def holders_by_card(found: NodeLedger, owners: Iterable[str]) -> dict[int, set[str]]:
    """The cards of the node holding any of ``owners`` (owner ids), and which."""
    wanted = set(owners)
    cards: dict[int, set[str]] = {}
    for allocation in found.live():
        if allocation.owner.id in wanted:
            for share in allocation.shares():
                cards.setdefault(share.index, set()).add(allocation.owner.id)
    return cards
