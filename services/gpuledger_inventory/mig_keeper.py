"""The node's part of MIG: instances made on request, destroyed when unheld, and faults inside one
instance kept to it (docs/mig.md, "The node's part: instances made and destroyed").

- ``make`` answers ``gpuledger.v1.inventory.<node>.mig.make`` (the node's plugin asks before a
  container starts): the instance at the asked placement, made if it is not there. The intent is
  written to the state file first; once made, the node is scanned and published at once, so the
  ledger shows the instance (``static=False``) with its MIG device's UUID. One change at a time.
- ``run`` destroys the on-demand instances no live allocation of the node's ledger has held for
  ``keep_s`` (``MigBook.due``); one with processes is tried again later. Static ones are never
  destroyed.
- ``on_event``: an XID that names a MIG instance marks that instance faulted, not its card; where
  remediation is on, one whose action is drain or reset also has its holder moved (remedy drain).

NVML is called through ``mig_config.MigConfig`` in worker threads, as the service's other calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core.codec import Reader
from gpuledger_core.errors import (
    Exhausted,
    FailedPrecondition,
    GpuledgerError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from gpuledger_core.ids import CardUuid
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.mig_profiles import GiProfile, mig_model
from gpuledger_core.model import MigSlot, Remedy
from gpuledger_inventory import metrics
from gpuledger_inventory.faults import Action
from gpuledger_inventory.inventory import CardInfo, EventKind, GpuEvent, MigMode
from gpuledger_inventory.mig_book import Key, MigBook, MigRecord, device_of, mig_cards, slot_of
from gpuledger_inventory.mig_config import MigBusy, MigConfig, MigRefused
from gpuledger_inventory.state import NodeState

log = logging.getLogger(__name__)
RETRY_S = 10.0  # an instance that could not be destroyed (processes) is tried again this often
RECLAIM_WAIT_S = 15.0  # a make waits this long for instances in its way to be let go (below MAKE_TIMEOUT_S)
RECLAIM_POLL_S = 0.25


class MigHost(Protocol):
    """What the keeper needs of the inventory service."""

    state: NodeState

    def nvml_open(self) -> bool: ...
    async def rescan(self) -> None: ...
    async def save(self) -> None: ...
    async def publish(self) -> None: ...


class MigKeeper:
    def __init__(
        self, host: MigHost, config: MigConfig | None, keep_s: float, clock: Callable[[], float], drains: bool = True
    ) -> None:
        self.host, self.config, self.keep_s, self.clock = host, config, keep_s, clock
        self.drains = drains  # a fault that needs its holder moved says so (remediation on, as for cards)
        self.wanted = asyncio.Event()  # a card in MIG mode, or a record: the node's ledger is followed
        self._ledger_seen = False
        self._lock = asyncio.Lock()  # one MIG change at a time
        self._wake = asyncio.Event()
        self.reclaim_wait_s = RECLAIM_WAIT_S
        host.state.mig.since = clock()

    @property
    def book(self) -> MigBook:
        return self.host.state.mig

    @contextlib.asynccontextmanager
    async def still(self) -> AsyncIterator[None]:
        """No MIG change while the body runs: a scan of the node. A scan that read the cards before
        an instance was made and were applied after it would forget the make's record (its instance
        not seen), and the instance would be published static for good; one that read them before
        a destroy would publish the gone instance."""
        async with self._lock:
            yield

    async def scanned(self) -> None:
        """A scan was applied: follow the ledger from the first card in MIG mode (or record) on;
        the records it forgot (their instance is gone: at a start, those of a crash before making)
        are logged and the state file saved without them."""
        if not self.book.empty() or any(True for _ in mig_cards(self.host.state.scan)):
            self.wanted.set()
            self._wake.set()
        gone, self.book.forgotten = self.book.forgotten, []
        for record in gone:
            log.info("MIG %s at %s on card %s (made for %s) is gone: forgotten", record.slot.profile,
                     record.slot.start, record.card, record.holder)  # fmt: skip
        if gone:
            await self.host.save()

    def set_ledger(self, ledger: NodeLedger | None) -> None:
        """The node's ledger now: the placements its live allocations hold."""
        held: list[Key] = []
        for allocation in ledger.live() if ledger is not None else ():
            held += [(s.uuid, s.mig) for s in allocation.shares() if s.mig is not None]
        self.book.set_held(held, self.clock())
        self._ledger_seen = True
        self._wake.set()

    # --- making ----------------------------------------------------------------------------------

    async def make(self, request: Any) -> dict[str, Any]:
        """``mig.make``: the instance at the asked placement, made for its holder if it is not there.
        Instances made on demand that overlap it and that no one holds (kept for reuse) are
        destroyed first; one still held in the node's ledger as this inventory last saw it, or
        still used by processes (a preempted holder's pod ending), is waited for up to
        ``reclaim_wait_s``. A static instance in the way is never destroyed: refused."""
        card, slot, holder = _ask(request)
        until = time.monotonic() + self.reclaim_wait_s
        while True:
            async with self._lock:
                waits = await self._make_once(card, slot, holder)
                if isinstance(waits, dict):
                    return waits
            if time.monotonic() >= until:
                raise Unavailable(f"{waits}; waited {self.reclaim_wait_s:g}s")
            await asyncio.sleep(RECLAIM_POLL_S)

    async def _make_once(self, card: str, slot: MigSlot, holder: str) -> dict[str, Any] | str:
        """The made instance's answer, or why it waits (instances in its way)."""
        info, profile, label = self._checked(card, slot)
        config = self._config(label)
        layout = await self._nvml(config.read, label, "read the card's instances", card)
        same = next((gi for gi in layout if slot_of(gi) == slot), None)
        if same is not None:
            fault = self.book.faults.get(device_of(info, same))
            if fault is not None:
                raise FailedPrecondition(f"{label}: the instance is unhealthy: {fault.reason}")
            return await self._answer(config, info, same.id, label, None)
        waits = await self._reclaim(config, info, [gi for gi in layout if slot_of(gi).overlaps(slot)], label, holder)
        if waits:
            return f"{label}: {waits}"
        key: Key = (info.uuid, slot)
        self.book.intend(info.uuid, slot, holder, self.clock())
        await self.host.save()  # the intent is on disk before NVML is asked
        try:
            made = await self._nvml(config.create, label, "make it", card, profile.index, slot)
        except GpuledgerError:
            self.book.forget(key)
            await self.host.save()
            raise
        log.info("%s: made GPU instance %d for %s", label, made, holder)
        metrics.MIG_CHANGES.labels(change="made").inc()
        return await self._answer(config, info, made, label, key)

    async def _reclaim(self, config: MigConfig, info: CardInfo, clashes: list[Any], label: str, holder: str) -> str:
        """Destroy the instances ``clashes`` (those overlapping the placement to make): each made on
        demand and held by no one. Why it must wait for the others ("" when none is left); a
        static one refuses the make."""
        static = [gi for gi in clashes if (info.uuid, slot_of(gi)) not in self.book.records]
        if static:
            gi = static[0]
            raise FailedPrecondition(
                f"{label}: overlaps the static instance {gi.profile} at {gi.start} on the card (an operator's, "
                "never destroyed)"
            )
        if clashes and not self._ledger_seen:
            return "the node's ledger is not read yet (the instances in its way may be held)"
        waits, destroyed = [], 0
        for gi in clashes:
            key: Key = (info.uuid, slot_of(gi))
            what = f"the instance {gi.profile} at {gi.start} in its way"
            if key in self.book.held:
                waits.append(f"{what} is still held in the node's ledger")
                continue
            try:
                await asyncio.to_thread(config.destroy, info.uuid, gi.id)
            except MigBusy as err:
                waits.append(f"{what} is still in use ({err})")
                continue
            except MigRefused as err:
                raise _refused(f"{label}: NVML refused to destroy {what}: {err}", err) from err
            self.book.forget(key)
            destroyed += 1
            metrics.MIG_CHANGES.labels(change="reclaimed").inc()
            log.info("%s: destroyed %s (made on demand, held by no one) for %s", label, what, holder)
        if destroyed:
            await self.host.save()
            if waits:
                await self.host.rescan()  # the ledger sees what is gone while the rest is waited for
        return "; ".join(waits)

    def _checked(self, card: str, slot: MigSlot) -> tuple[CardInfo, GiProfile, str]:
        state = self.host.state
        info = state.card_info(card)
        at = f"MIG {slot.profile} at {slot.start}"
        if info is None:
            raise NotFound(f"no card {card} on node {state.name} (for {at})")
        label = f"card {info.card.index} ({info.uuid}) on node {state.name}, {at}"
        if info.mig_mode is not MigMode.ENABLED:
            raise FailedPrecondition(f"{label}: the card is not in MIG mode (its MIG mode is {info.mig_mode})")
        model = mig_model(info.card.model, info.card.memory_mib)
        if model is None:
            raise FailedPrecondition(f"{label}: gpuledger knows no MIG profiles of {info.card.model}")
        profile = model.by_name(slot.profile)
        if profile is None:
            offered = ", ".join(p.name for p in model.profiles)
            raise InvalidArgument(
                "profile", f"{label}: {info.card.model} offers no {slot.profile} (it offers {offered})"
            )
        if slot.size != profile.memory_slices or slot.start not in profile.starts:
            starts = ", ".join(map(str, profile.starts))
            raise InvalidArgument("start", f"{label}: {slot.profile} has no placement at {slot.start} of size "
                                  f"{slot.size} (starts {starts}, size {profile.memory_slices})")  # fmt: skip
        return info, profile, label

    def _config(self, label: str) -> MigConfig:
        if self.config is None or not self.host.nvml_open():
            raise Unavailable(f"{label}: NVML is not open on this node now (starting, failed or lent to a reset)")
        return self.config

    async def _answer(self, config: MigConfig, info: CardInfo, gi: int, label: str, key: Key | None) -> dict[str, Any]:
        """Its compute instance (made where it has none), then the scan and the publication."""
        try:
            device = await self._nvml(config.compute, label, "make its compute instance", info.uuid, gi)
        finally:
            if key is not None:
                self.book.made(key)
        await self.host.rescan()
        return MadeMig(device.uuid, gi, device.compute_instance, info.card.index, info.card.minor).to_json()

    async def _nvml(self, call: Callable[..., Any], label: str, what: str, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(call, *args)
        except MigRefused as err:
            raise _refused(f"{label}: NVML refused to {what}: {err}", err) from err

    # --- destroying ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Destroy what is due, on every change of the ledger and when the next one comes due."""
        while True:
            await self.sweep()
            due = self.book.next_due(self.keep_s)
            wait = RETRY_S if due is None else min(RETRY_S, max(0.05, due - self.clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            self._wake.clear()

    async def sweep(self) -> None:
        """Destroy the on-demand instances unheld for ``keep_s`` (only once the ledger was read)."""
        if not self._ledger_seen or self.config is None or not self.host.nvml_open():
            return
        async with self._lock:
            destroyed = 0
            for record, gi in self.book.due(self.host.state.scan, self.clock(), self.keep_s):
                destroyed += await self._destroy(self.config, record, gi.id)
            if destroyed:
                await self.host.rescan()

    async def _destroy(self, config: MigConfig, record: MigRecord, gi: int) -> int:
        where = f"MIG {record.slot.profile} at {record.slot.start} on card {record.card}"
        try:
            await asyncio.to_thread(config.destroy, record.card, gi)
        except MigBusy as err:
            log.info("%s: unheld, but in use (%s); tried again later", where, err)
            return 0
        except MigRefused as err:
            log.warning("%s: NVML refused to destroy it (%s); tried again later", where, err)
            return 0
        self.book.forget(record.key)
        metrics.MIG_CHANGES.labels(change="destroyed").inc()
        log.info("%s: destroyed (made for %s, unheld for %gs)", where, record.holder, self.keep_s)
        return 1

    # --- faults ----------------------------------------------------------------------------------

    async def on_event(self, event: GpuEvent) -> bool:
        """An XID naming a MIG instance of a card in MIG mode marks that instance faulted; whether
        it was taken here (else it is the card's). One whose action is ``retire`` stays the card's."""
        if event.kind is not EventKind.XID or not event.mig_uuid or event.uuid is None:
            return False
        info = self.host.state.card_info(event.uuid)
        if info is None or info.mig_mode is not MigMode.ENABLED:
            return False
        action, reason = self.host.state.book.policy.faults.action_for(event)
        if action is Action.RETIRE:
            return False
        metrics.HEALTH_EVENTS.labels(
            kind=event.kind.value, acted="yes" if action is not Action.APPLICATION else "no"
        ).inc()
        where = _instance_name(info, event.mig_uuid)
        if action is Action.APPLICATION:
            log.info("%s: %s (the application's own fault: nothing done)", where, reason)
            return True
        drain = self.drains and action.severity >= Action.DRAIN.severity
        remedy = Remedy.DRAIN if drain else Remedy.NONE
        if self.book.fault(CardUuid(event.uuid), event.mig_uuid, reason, remedy, self.clock()):
            moved = "its holder must move off" if remedy is Remedy.DRAIN else "its holder stays"
            log.warning("%s is unhealthy: %s (action %s): it takes no new holder, %s; the card and its other "
                        "instances are unaffected", where, reason, action.value, moved)  # fmt: skip
            await self.host.save()
            await self.host.publish()
        return True

    def clear(self, card: CardUuid) -> bool:
        """An operator marked the card healthy: its instances' faults go too. Whether any did."""
        cleared = self.book.clear_faults(card)
        if cleared:
            log.warning("card %s marked healthy: the faults of its MIG instance(s) %s are cleared", card, cleared)
        return bool(cleared)


def _instance_name(info: CardInfo, device: str) -> str:
    mig = next((m for m in info.mig if m.uuid == device), None)
    gi = next((g for g in info.gpu_instances or () if mig is not None and g.id == mig.gpu_instance), None)
    what = f"{gi.profile}@{gi.start} ({device})" if gi is not None else device
    return f"MIG instance {what} on card {info.card.index} ({info.uuid})"


def _ask(request: Any) -> tuple[str, MigSlot, str]:
    r = Reader(request)
    card, holder = r.text("card"), r.text("holder")
    slot = MigSlot(r.text("profile"), r.integer("start"), r.integer("size"))
    if not card or not slot.profile or not holder:
        raise InvalidArgument("body", "card, profile and holder must not be empty")
    return card, slot, holder


def _refused(message: str, err: MigRefused) -> GpuledgerError:
    if err.kind == "InsufficientResources":
        return Exhausted(message)
    if err.kind == "NoPermission":
        return PermissionDenied(message)
    if isinstance(err, MigBusy) or err.kind in ("InvalidArgument", "NotFound"):
        return FailedPrecondition(message)
    return Unavailable(message)
