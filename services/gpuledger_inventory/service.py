"""The inventory's loops: NVML (scan, health events, re-init), usage polling, publishing, labels.

``Inventory.run()`` owns a TaskGroup with one task per loop; cancelling it stops them all. Every
NVML call goes through a worker thread (they block); the event wait is bounded by
``event_wait_ms`` so a stop never waits longer than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client

from gpuledger_common import bus, inventory_api
from gpuledger_common.store.follow import node_ledger
from gpuledger_common.store.ledgerwait import open_ledger
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Health
from gpuledger_inventory import metrics, operator_word
from gpuledger_inventory.health import HealthBook, Transition
from gpuledger_inventory.inventory import EventKind, GpuEvent
from gpuledger_inventory.kube import NodeApi
from gpuledger_inventory.labels import label_patch, node_labels
from gpuledger_inventory.mig_config import MigConfig
from gpuledger_inventory.mig_keeper import MigKeeper
from gpuledger_inventory.nvml import Gpus, NvmlUnavailable
from gpuledger_inventory.publisher import SlicePublisher
from gpuledger_inventory.remediation import Step, need_of
from gpuledger_inventory.remediator import Remediator, record_metrics
from gpuledger_inventory.repair import Checker, Resetter
from gpuledger_inventory.settings import InventorySettings
from gpuledger_inventory.state import NodeState, same_content
from gpuledger_inventory.state_file import HealthStore

log = logging.getLogger(__name__)
ADOPT_WAIT_S = 10.0  # how long the first publication waits for the ledger's remedies to resume


class _Rescan(Exception):
    """The card configuration changed (MIG); scan again."""


class _Release(Exception):
    """A card's reset needs NVML let go of; open it again once the reset is done."""


@dataclass(slots=True)
class _Hold:
    released: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Inventory:
    def __init__(
        self,
        settings: InventorySettings,
        gpus: Gpus,
        state: NodeState,
        nc: Client,
        node_api: NodeApi | None = None,
        store: HealthStore | None = None,
        clock: Callable[[], float] = time.time,
        slices: SlicePublisher | None = None,
        repair: tuple[Resetter, Checker] | None = None,
    ) -> None:
        self.settings, self.gpus, self.state, self.nc = settings, gpus, state, nc
        self.slices = slices  # DRA mode: the node's ResourceSlices follow every publication
        self.node_api, self.store, self.clock = node_api, store or HealthStore(""), clock
        self.ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._labels_changed = asyncio.Event()
        self._nvml_failed: str = ""
        self._seq = 0
        self._last: dict[str, Any] | None = None
        self._last_at = float("-inf")
        self._hold: _Hold | None = None  # a reset waits for NVML to be let go of
        self._lent = False  # NVML is closed for a reset
        self._opened = asyncio.Event()
        self.remediator = (
            None if repair is None else Remediator(self, *repair, clock=clock, interval_s=settings.poll_interval_s)
        )
        # no saved remediation: the node's ledger may still show one, which resumes before the node
        # is published (a publication would overwrite the ledger's remedies with none)
        self._adopting = self.remediator is not None and not state.remedies.cards
        self._adopt_until = time.monotonic() + ADOPT_WAIT_S
        self._save_lock = asyncio.Lock()  # saves in the order asked (a MIG intent must not be lost)
        self.mig = MigKeeper(self, _mig_config(gpus), settings.mig_keep_s, clock, drains=settings.remediate)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._nvml_loop(), name="nvml")
            tg.create_task(self._poll_loop(), name="poll")
            tg.create_task(self._publish_loop(), name="publish")
            tg.create_task(self._heartbeat_loop(), name="heartbeat")
            if self.node_api is not None:
                tg.create_task(self._label_loop(self.node_api), name="labels")
            if self.slices is not None:
                tg.create_task(self.slices.run(), name="slices")
                tg.create_task(self.slices.follow(), name="slices-watch")
            tg.create_task(self._holders_loop(), name="holders")
            tg.create_task(self.mig.run(), name="mig")
            if self.remediator is not None:
                tg.create_task(self.remediator.run(), name="remediation")

    async def close(self) -> None:
        await asyncio.to_thread(self.gpus.close)

    async def _holders_loop(self) -> None:
        """Follow the node's ledger: in DRA mode the slices taint the cards that pods or tools
        outside DRA hold and say each card's isolation tier (``SlicePublisher.set_ledger``); the
        remediation drains a card once nobody holds it, and at a start without a saved remediation
        resumes the remedies the ledger shows (``_adopt``); the MIG keeper destroys the on-demand
        instances nobody holds. Without slices or remediation it waits for a card in MIG mode."""
        if self.slices is None and self.remediator is None:
            await self.mig.wanted.wait()
        store = await open_ledger(self.nc, None)
        if self._adopting and self.remediator is not None:
            try:  # a watch says nothing of a key not there: the first read is a read
                ledger, _ = await store.read(self.settings.node)
            except GpuledgerError as err:
                log.warning("cannot read the node's ledger yet (its watch will tell): %s", err)
            else:
                await self._adopt(self.remediator, ledger)
        async with contextlib.aclosing(node_ledger(store, self.settings.node)) as ledgers:
            async for ledger in ledgers:
                if self._adopting and self.remediator is not None:
                    await self._adopt(self.remediator, ledger)
                if self.slices is not None:
                    self.slices.set_ledger(ledger)
                if self.remediator is not None:
                    self.remediator.set_ledger(ledger)
                self.mig.set_ledger(ledger)

    async def _adopt(self, remediator: Remediator, ledger: NodeLedger | None) -> None:
        """The ledger's first read, at a start without a saved remediation: its remedies resume."""
        self._adopting = False
        steps, transitions = remediator.adopt(ledger, self.clock(), health_saved=self.store.found)
        if steps:
            log.warning("resuming the remediation of %d card(s) from the node's ledger", len(steps))
        await self._changed_remedy(steps, transitions)
        self._changed.set()  # the first publication waited for this

    # --- NVML ----------------------------------------------------------------------------------

    async def _nvml_loop(self) -> None:
        backoff = 0.5
        while True:
            try:
                await self._start_nvml()
                backoff = 0.5
                await self._watch_events()
            except _Rescan:
                continue
            except _Release:
                await self._lend_nvml()
                continue
            except NvmlUnavailable as err:
                await self._nvml_down(str(err))
                await asyncio.to_thread(self.gpus.close)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.nvml_retry_max_s)

    async def _start_nvml(self) -> None:
        await asyncio.to_thread(self.gpus.open)
        async with self.mig.still():  # read and applied with no MIG change in between
            scan = await asyncio.to_thread(self.gpus.scan)
            now = self.clock()
            transitions = self.state.apply_scan(scan, now) + self.state.nvml_up(now)
        metrics.SCAN_SECONDS.observe(scan.took_s)
        metrics.CARDS.set(len(scan.cards))
        log.info("scanned %d cards in %.3fs%s", len(scan.cards), scan.took_s, _problems(scan.problems))
        self._nvml_failed = ""
        await self.mig.scanned()
        failed = await asyncio.to_thread(self.gpus.watch, self.state.scan or scan)
        for uuid, problem in failed.items():
            transitions += self.state.book.on_registration_failed(uuid, problem, now)
        await self._poll_once()
        metrics.NVML_UP.set(1)
        self.state.labels = node_labels(self.state.scan or scan)
        self._labels_changed.set()
        self._opened.set()
        await self._record(transitions)

    async def _nvml_down(self, error: str) -> None:
        self._opened.clear()
        log.error("NVML failed, every card is unhealthy until it answers again: %s", error)
        metrics.NVML_UP.set(0)
        metrics.NVML_FAILURES.inc()
        await self._record(self.state.nvml_down(error, self.clock()))
        self._changed.set()

    async def _watch_events(self) -> None:
        wait_ms = self.settings.event_wait_ms
        while True:
            if self._nvml_failed:
                raise NvmlUnavailable(self._nvml_failed)
            if self._hold is not None:
                raise _Release()
            event = await asyncio.to_thread(self.gpus.wait, wait_ms)
            if event is None:
                await self._record(self.state.book.tick(self.clock()))
                continue
            await self._on_event(event)

    async def _on_event(self, event: GpuEvent) -> None:
        if event.kind is EventKind.MIG_CHANGE:
            log.info("MIG configuration changed on %s; scanning again", event.uuid)
            raise _Rescan()
        if await self.mig.on_event(event):  # an XID inside one MIG instance is that instance's, not the card's
            return
        now = self.clock()
        transitions = self.state.book.on_event(event, self.state.uuids(), now)
        if not transitions:
            await self._changed_remedy(self._fault_under_repair(event, now), [])
        acted = "yes" if transitions else "no"
        metrics.HEALTH_EVENTS.labels(kind=event.kind.value, acted=acted).inc()
        log.info("health event %s xid=%s on %s (%s)", event.kind.value, event.xid, event.uuid, acted)
        await self._record(transitions)

    # --- lending NVML to a reset ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def nvml_released(self) -> AsyncIterator[None]:
        """NVML closed by this service while the body runs (a reset is refused while a client holds
        the card); the NVML loop opens it again and scans afresh once the body is done."""
        hold = self._hold = _Hold()
        try:
            await hold.released.wait()
            yield
        finally:
            self._hold = None
            hold.done.set()

    async def nvml_ready(self) -> None:
        await self._opened.wait()

    async def _lend_nvml(self) -> None:
        hold = self._hold
        self._opened.clear()
        self._lent = True
        try:
            await asyncio.to_thread(self.gpus.close)
            if hold is not None:
                hold.released.set()
                await hold.done.wait()
        finally:
            self._lent = False

    def _fault_under_repair(self, event: GpuEvent, now: float) -> list[Step]:
        """A fault on a card the health book already holds unhealthy records no transition; one
        under remediation may still need more (a fault while it is checked retires it)."""
        if self.remediator is None or event.uuid is None:
            return []
        if self.state.remedies.of(event.uuid).stage.value in ("serving", "faulted"):
            return []
        scratch = HealthBook(self.state.book.policy)
        if not scratch.on_event(event, [event.uuid], now):
            return []
        found = scratch.of(event.uuid)
        return self.remediator.observe_fault(event.uuid, need_of(found), found.reason, now)

    # --- usage ---------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_interval_s)
            if self.state.nvml_ok and not self._nvml_failed and not self._lent:
                await self._poll_once()

    async def _poll_once(self) -> None:
        if self.state.scan is None:
            return
        try:
            usage = await asyncio.to_thread(self.gpus.usage, self.state.scan)
        except NvmlUnavailable as err:
            self._nvml_failed = str(err)  # the NVML loop re-initialises
            await self._nvml_down(str(err))
            return
        for card in usage.cards:
            metrics.CARD_PROCESSES.labels(uuid=card.uuid).set(len(card.processes))
            metrics.CARD_PROCESS_MEMORY.labels(uuid=card.uuid).set(sum(p.used_mib or 0 for p in card.processes))
            if card.memory_used_mib is not None:
                metrics.CARD_MEMORY_USED.labels(uuid=card.uuid).set(card.memory_used_mib)
        await self._record(self.state.apply_usage(usage, self.clock()))
        self._changed.set()
        if self.remediator is not None:
            self.remediator.poke()

    # --- health records ------------------------------------------------------------------------

    async def _record(self, transitions: list[Transition]) -> None:
        """Each transition is logged, counted, published on the health subject and saved."""
        for t in transitions:
            level = logging.WARNING if t.health is Health.UNHEALTHY else logging.INFO
            log.log(level, "card %s is now %s (%s) by %s", t.uuid, t.health.value, t.reason, t.by)
            metrics.TRANSITIONS.labels(health=t.health.value, by=t.by.split(":")[0]).inc()
            body = {
                "node": self.state.name,
                "at": t.at,
                "uuid": t.uuid,
                "health": t.health.value,
                "reason": t.reason,
                "by": t.by,
            }
            await self._send("health", inventory_api.health_subject(self.state.name), body)
        self._update_health_gauges()
        steps = self.remediator.observe(transitions) if self.remediator is not None else []
        if steps:
            await self._changed_remedy(steps, [])
        elif transitions:
            await self._save()
            await self._publish_now()

    async def changed(self, steps: list[Step], transitions: list[Transition]) -> None:
        """The remediation moved (``Host`` of the remediator): record, save and publish."""
        await self._changed_remedy(steps, transitions)

    async def _changed_remedy(self, steps: list[Step], transitions: list[Transition]) -> None:
        for step in steps:
            level = logging.ERROR if step.stage.value == "retired" else logging.WARNING
            log.log(level, "card %s: remediation %s (%s)", step.uuid, step.stage.value, step.reason)
        record_metrics(steps, self.state.remedies)
        if transitions:
            await self._record(transitions)  # saves and publishes
        elif steps:
            await self._save()
            await self._publish_now()

    async def _save(self) -> None:
        remedies = self.state.remedies if self.remediator is not None else None
        async with self._save_lock:
            await asyncio.to_thread(self.store.save, self.state.book, remedies, self.state.mig)

    def _update_health_gauges(self) -> None:
        for info in self.state.scan.cards if self.state.scan else ():
            healthy = self.state.book.of(info.uuid).health is Health.HEALTHY
            labels = {"uuid": info.uuid, "index": str(info.card.index), "model": info.card.model}
            metrics.CARD_HEALTHY.labels(**labels).set(1 if healthy else 0)

    # --- publishing ----------------------------------------------------------------------------

    async def _send(self, kind: str, subject: str, body: Any) -> bool:
        try:
            await self.nc.publish(subject, bus.encode(body))
        except Exception as err:  # disconnected and the reconnect buffer is full, or closed
            metrics.PUBLISH_ERRORS.labels(kind=kind).inc()
            log.warning("cannot publish %s on %s: %s", kind, subject, err)
            return False
        metrics.PUBLISHED.labels(kind=kind).inc()
        return True

    async def _publish_now(self) -> None:
        """Publish the inventory at once (health changes must not wait for the loop's turn); not
        before the ledger's remedies were resumed (``_adopt``), unless the ledger does not answer
        within ``ADOPT_WAIT_S``; never before NVML was first asked (``NodeState.known``)."""
        if (self._adopting and time.monotonic() < self._adopt_until) or not self.state.known():
            return
        message = self.state.message(self.clock())
        if await self._send("inventory", inventory_api.inventory_subject(self.state.name), message):
            self._last = message
            self._last_at = time.monotonic()
            self.ready.set()
        if self.slices is not None:
            self.slices.poke()

    async def _publish_loop(self) -> None:
        interval = self.settings.inventory_interval_s
        while True:
            wait = max(0.0, self._last_at + interval - time.monotonic()) if self.ready.is_set() else 1.0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._changed.wait()
            self._changed.clear()
            message = self.state.message(self.clock())
            if same_content(self._last, message) and time.monotonic() - self._last_at < interval:
                continue
            await self._publish_now()

    async def _heartbeat_loop(self) -> None:
        while True:
            self._seq += 1
            body = self.state.heartbeat(self.clock(), self._seq)
            await self._send("heartbeat", inventory_api.heartbeat_subject(self.state.name), body)
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    # --- labels --------------------------------------------------------------------------------

    async def _label_loop(self, api: NodeApi) -> None:
        applied: dict[str, str] | None = None
        while True:
            if applied == self.state.labels:
                await self._labels_changed.wait()
            self._labels_changed.clear()
            desired = dict(self.state.labels)
            try:
                current = await api.get_labels(self.state.name)
                patch = label_patch(current, desired)
                if patch:
                    await api.patch_labels(self.state.name, patch)
                    metrics.LABEL_PATCHES.inc()
                    log.info("node labels updated: %s", patch)
                applied = desired
            except Exception as err:
                metrics.LABEL_ERRORS.inc()
                log.warning("cannot label node %s: %s", self.state.name, err)
                await asyncio.sleep(self.settings.nvml_retry_max_s)

    # --- operator requests ---------------------------------------------------------------------

    async def set_health(self, request: Any) -> dict[str, Any]:
        """An operator's word on a card's health (the ``set_health`` subject): ``operator_word``."""
        return await operator_word.set_health(self, request)

    async def get(self, request: Any) -> dict[str, Any]:
        return self.state.message(self.clock())

    # --- MIG (the MIG keeper's host) -------------------------------------------------------------

    def nvml_open(self) -> bool:
        return self._opened.is_set() and self.state.nvml_ok and not self._nvml_failed and not self._lent

    async def rescan(self) -> None:
        """Scan again at once (a MIG instance made or destroyed, by the MIG keeper with its changes
        held), save and publish."""
        if self.nvml_open():
            scan = await asyncio.to_thread(self.gpus.scan)
            await self._record(self.state.apply_scan(scan, self.clock()))
        await self._save()
        await self._publish_now()

    async def save(self) -> None:
        await self._save()

    async def publish(self) -> None:
        await self._publish_now()


def _mig_config(gpus: Gpus) -> MigConfig | None:
    """MIG changes through the backend's NVML module (None where the backend has none)."""
    nv = getattr(gpus, "nvml", None)
    return MigConfig(nv) if nv is not None and hasattr(nv, "nvmlDeviceCreateGpuInstanceWithPlacement") else None


def _problems(problems: tuple[str, ...]) -> str:
    return f" ({'; '.join(problems)})" if problems else ""
