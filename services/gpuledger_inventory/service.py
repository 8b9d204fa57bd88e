"""The inventory's loops: NVML (scan, health events, re-init), usage polling, publishing, labels.

``Inventory.run()`` owns a TaskGroup with one task per loop; cancelling it stops them all. Every
NVML call goes through a worker thread (they block); the event wait is bounded by
``event_wait_ms`` so a stop never waits longer than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from gpuledger_common import bus, inventory_api
from gpuledger_common.store.follow import node_ledger
from gpuledger_common.store.ledgerwait import open_ledger
from gpuledger_core.errors import InvalidArgument, NotFound
from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Health
from gpuledger_inventory import metrics
from gpuledger_inventory.health import HealthBook, HealthPolicy, Transition
from gpuledger_inventory.inventory import EventKind, GpuEvent
from gpuledger_inventory.kube import NodeApi
from gpuledger_inventory.labels import label_patch, node_labels
from gpuledger_inventory.nvml import Gpus, NvmlUnavailable
from gpuledger_inventory.publisher import SlicePublisher
from gpuledger_inventory.settings import InventorySettings
from gpuledger_inventory.state import NodeState, same_content

log = logging.getLogger(__name__)


class _Rescan(Exception):
    """The card configuration changed (MIG); scan again."""


class HealthStore:
    """The health book on disk, so a restart never turns a card healthy silently."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None

    def load(self, policy: HealthPolicy) -> HealthBook:
        if self.path is None or not self.path.exists():
            return HealthBook(policy)
        try:
            return HealthBook.from_json(json.loads(self.path.read_text()), policy)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise InvalidArgument("state_file", f"cannot read {self.path}: {err}") from err

    def save(self, book: HealthBook) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".health-")
        with os.fdopen(fd, "w") as out:
            json.dump(book.to_json(), out)
        os.replace(tmp, self.path)


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
                tg.create_task(self._holders_loop(self.slices), name="holders")

    async def close(self) -> None:
        await asyncio.to_thread(self.gpus.close)

    async def _holders_loop(self, slices: SlicePublisher) -> None:
        """DRA mode: follow the node's ledger, so that the slices taint the cards that pods or tools
        outside DRA hold and say each card's isolation tier (``SlicePublisher.set_ledger``)."""
        store = await open_ledger(self.nc, None)
        async with contextlib.aclosing(node_ledger(store, self.settings.node)) as ledgers:
            async for ledger in ledgers:
                slices.set_ledger(ledger)

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
            except NvmlUnavailable as err:
                await self._nvml_down(str(err))
                await asyncio.to_thread(self.gpus.close)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.nvml_retry_max_s)

    async def _start_nvml(self) -> None:
        await asyncio.to_thread(self.gpus.open)
        scan = await asyncio.to_thread(self.gpus.scan)
        now = self.clock()
        metrics.SCAN_SECONDS.observe(scan.took_s)
        metrics.CARDS.set(len(scan.cards))
        log.info(
            "scanned %d cards in %.3fs%s", len(scan.cards), scan.took_s, _problems(scan.problems)
        )
        self._nvml_failed = ""
        transitions = self.state.apply_scan(scan, now) + self.state.nvml_up(now)
        failed = await asyncio.to_thread(self.gpus.watch, self.state.scan or scan)
        for uuid, problem in failed.items():
            transitions += self.state.book.on_registration_failed(uuid, problem, now)
        await self._poll_once()
        metrics.NVML_UP.set(1)
        self.state.labels = node_labels(self.state.scan or scan)
        self._labels_changed.set()
        await self._record(transitions)

    async def _nvml_down(self, error: str) -> None:
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
            event = await asyncio.to_thread(self.gpus.wait, wait_ms)
            if event is None:
                await self._record(self.state.book.tick(self.clock()))
                continue
            await self._on_event(event)

    async def _on_event(self, event: GpuEvent) -> None:
        if event.kind is EventKind.MIG_CHANGE:
            log.info("MIG configuration changed on %s; scanning again", event.uuid)
            raise _Rescan()
        transitions = self.state.book.on_event(event, self.state.uuids(), self.clock())
        acted = "yes" if transitions else "no"
        metrics.HEALTH_EVENTS.labels(kind=event.kind.value, acted=acted).inc()
        log.info(
            "health event %s xid=%s on %s (%s)", event.kind.value, event.xid, event.uuid, acted
        )
        await self._record(transitions)

    # --- usage ---------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_interval_s)
            if self.state.nvml_ok and not self._nvml_failed:
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
            metrics.CARD_PROCESS_MEMORY.labels(uuid=card.uuid).set(
                sum(p.used_mib or 0 for p in card.processes)
            )
            if card.memory_used_mib is not None:
                metrics.CARD_MEMORY_USED.labels(uuid=card.uuid).set(card.memory_used_mib)
        await self._record(self.state.apply_usage(usage, self.clock()))
        self._changed.set()

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
        if transitions:
            await asyncio.to_thread(self.store.save, self.state.book)
            await self._publish_now()

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
        """Publish the inventory at once (health changes must not wait for the loop's turn)."""
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
            wait = (
                max(0.0, self._last_at + interval - time.monotonic())
                if self.ready.is_set()
                else 1.0
            )
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
        if not isinstance(request, dict):
            raise InvalidArgument("body", "must be an object")
        healthy = request.get("healthy")
        who = request.get("by")
        if not isinstance(healthy, bool):
            raise InvalidArgument("healthy", "must be true or false")
        if not isinstance(who, str) or not who:
            raise InvalidArgument("by", "must name who decides (an operator or a tool)")
        info = self.state.card_info(request.get("uuid"), _index(request.get("index")))
        if info is None:
            raise NotFound(
                f"no card {request.get('uuid') or request.get('index')} on node {self.state.name}"
            )
        note = str(request.get("note") or "")
        transitions = self.state.book.set(CardUuid(info.uuid), healthy, who, note, self.clock())
        await self._record(transitions)
        h = self.state.book.of(info.uuid)
        card = {
            "uuid": info.uuid,
            "index": info.card.index,
            "health": h.health.value,
            "reason": h.reason,
            "since": h.since,
            "by": h.by,
        }
        return {"card": card, "changed": bool(transitions)}

    async def get(self, request: Any) -> dict[str, Any]:
        return self.state.message(self.clock())


def _index(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument("index", f"must be a card index, got {value!r}")
    return value


def _problems(problems: tuple[str, ...]) -> str:
    return f" ({'; '.join(problems)})" if problems else ""
