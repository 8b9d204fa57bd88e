"""The inventory's remediation loop: drives the remediation book (remediation.py) from what the
node sees, and does the reset and the check.

Inputs: the health book's transitions and the faults on cards already unhealthy (``observe``,
``observe_fault``), the node's ledger (``set_ledger``: who holds each card; ``adopt``: at a start
without a saved book, the remedies it still shows) and NVML's processes
(the node state's usage). A quarantined card with no holder and no process is drained; a drained
card is reset (NVML released by the inventory meanwhile, since a reset is refused while a client
holds the card) and checked, or only checked, one card at a time; the card then goes back to
service (its health healed by ``rule:remediation``) or is retired. Every step goes to ``Host.changed``,
which records, publishes (the card's remedy in the ledger) and saves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from gpuledger_core.ids import CardUuid
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Card, Health, Remedy
from gpuledger_inventory import metrics
from gpuledger_inventory.faults import Action
from gpuledger_inventory.health import NVML_FAILED, Transition
from gpuledger_inventory.nvml import NvmlUnavailable
from gpuledger_inventory.remediation import RemediationBook, ResetOutcome, Stage, Step, need_of, resumed_goal
from gpuledger_inventory.repair import Checker, Resetter
from gpuledger_inventory.state import NodeState

log = logging.getLogger(__name__)
BY = "rule:remediation"


class Host(Protocol):
    """What the remediator needs of the inventory service."""

    state: NodeState

    def nvml_released(self) -> AbstractAsyncContextManager[None]: ...
    async def nvml_ready(self) -> None: ...
    async def changed(self, steps: list[Step], transitions: list[Transition]) -> None: ...


class Remediator:
    def __init__(
        self, host: Host, resetter: Resetter, checker: Checker, clock: Callable[[], float], interval_s: float
    ) -> None:
        self.host, self.resetter, self.checker, self.clock = host, resetter, checker, clock
        self.interval_s = interval_s
        self.ledger: NodeLedger | None = None
        self.ledger_read = False  # nothing is drained before the node's ledger has been read
        self._poked = asyncio.Event()

    @property
    def book(self) -> RemediationBook:
        return self.host.state.remedies

    # --- inputs --------------------------------------------------------------------------------

    def observe(self, transitions: list[Transition]) -> list[Step]:
        """The health book's transitions: a fault starts (or moves) a remediation, a heal ends it."""
        steps: list[Step] = []
        for t in transitions:
            if t.by == BY:
                continue
            if t.health is Health.UNHEALTHY:
                steps += self.book.on_fault(t.uuid, need_of(self.host.state.book.of(t.uuid)), t.reason, t.at)
            else:
                steps += self.book.on_healed(t.uuid, t.by, t.at)
        self._poke_if(steps)
        return steps

    def observe_fault(self, uuid: CardUuid, need: Action, reason: str, now: float) -> list[Step]:
        """A fault on a card the health book already holds unhealthy (it records no transition)."""
        steps = self.book.on_fault(uuid, need, reason, now)
        self._poke_if(steps)
        return steps

    def adopt(
        self, ledger: NodeLedger | None, now: float, *, health_saved: bool = False
    ) -> tuple[list[Step], list[Transition]]:
        """A start without a saved book (no state file): each card the node's ledger shows under
        repair resumes from its remedy (``RemediationBook.adopt``) and stays unhealthy meanwhile;
        one it shows unhealthy under no remedy (a fault that takes no new work, an operator's
        word) stays unhealthy, faulted, until an operator heals it (``_held_unhealthy``), unless a
        saved health book says how it is (``health_saved``); called with the ledger's first read,
        before the node's first publication."""
        steps: list[Step] = []
        transitions: list[Transition] = []
        health = self.host.state.book
        for card in ledger.node.cards if ledger is not None else ():
            if card.uuid in self.book.cards:
                continue
            if card.remedy is Remedy.NONE:
                if not health_saved and _held_unhealthy(card) and health.of(card.uuid).health is Health.HEALTHY:
                    transitions += health.on_resumed(card.uuid, card.health_reason, Action.NO_NEW_WORK, now)
                    steps += self.book.on_fault(card.uuid, Action.NO_NEW_WORK, card.health_reason, now)
                continue
            goal = resumed_goal(card.remedy, card.health_reason, health.policy.faults)
            steps += self.book.adopt(card.uuid, card.remedy, goal, card.health_reason, now)
            transitions += health.on_resumed(card.uuid, card.health_reason, goal, now)
        self._poke_if(steps)
        return steps, transitions

    def set_ledger(self, ledger: NodeLedger | None) -> None:
        self.ledger, self.ledger_read = ledger, True
        self._poked.set()

    def poke(self) -> None:
        self._poked.set()

    def _poke_if(self, steps: list[Step]) -> None:
        if steps:
            self._poked.set()

    # --- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.host.changed(self.book.resume(self.clock()), [])
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._poked.wait()
            self._poked.clear()
            await self.turn()

    async def turn(self) -> None:
        now = self.clock()
        empty = [u for u in self.book.in_stage(Stage.QUARANTINED) if self._empty(u)]
        await self.host.changed([s for u in empty for s in self.book.on_empty(u, now)], [])
        for uuid in self.book.in_stage(Stage.DRAINED):
            await self._repair(uuid)
        for uuid in self.book.in_stage(Stage.CHECKING):
            await self._check(uuid)

    def _empty(self, uuid: CardUuid) -> bool:
        """No holder in the ledger and no process NVML can see (a lost card shows none)."""
        if not self.ledger_read:
            return False
        held = any(s.uuid == uuid for a in (self.ledger.live() if self.ledger else ()) for s in a.shares())
        usage = self.host.state.usage.of(uuid)
        return not held and (usage is None or not usage.processes)

    async def _repair(self, uuid: CardUuid) -> None:
        card = self._card(uuid)
        await self.host.changed(self.book.begin(uuid, self.clock()), [])
        if card is None or self.book.of(uuid).stage is not Stage.RESETTING:
            return
        log.warning("resetting card %s (%s)", uuid, self.book.of(uuid).history[-2].reason)
        async with self.host.nvml_released():
            outcome, detail = await self.resetter.reset(card)
        level = logging.INFO if outcome is ResetOutcome.OK else logging.ERROR
        log.log(level, "reset of %s: %s %s", uuid, outcome, detail)
        await self.host.changed(self.book.on_reset(uuid, outcome, detail, self.clock()), [])

    async def _check(self, uuid: CardUuid) -> None:
        card = self._card(uuid)
        if card is None:
            return
        await self.host.nvml_ready()
        try:
            problems = await self.checker.check(card, self.book.of(uuid).goal is Action.RESET)
        except NvmlUnavailable as err:
            log.warning("cannot check card %s now (%s): trying again later", uuid, err)
            return
        now = self.clock()
        steps = self.book.on_check(uuid, problems, now)
        healed: list[Transition] = []
        if self.book.of(uuid).stage is Stage.SERVING:
            healed = self.host.state.book.on_repaired(uuid, BY, now)
        await self.host.changed(steps, healed)

    def _card(self, uuid: CardUuid) -> Card | None:
        info = self.host.state.card_info(uuid)
        return None if info is None else info.card


def record_metrics(steps: list[Step], book: RemediationBook) -> None:
    for step in steps:
        metrics.REMEDIATION_STEPS.labels(stage=step.stage.value).inc()
        if step.stage is Stage.DRAINED:
            metrics.FAULT_TO_DRAINED.observe(step.took_s)
        elif step.stage is Stage.SERVING and step.reason.startswith("checked"):
            metrics.FAULT_TO_BACK.observe(step.took_s)
    metrics.RETIRED_CARDS.set(len(book.in_stage(Stage.RETIRED)))


def _held_unhealthy(card: Card) -> bool:
    """The ledger shows the card unhealthy for a reason a restart must not forget: anything but
    NVML's own failure (the inventory asks NVML again at its start, and heals that when it answers)."""
    return card.health is Health.UNHEALTHY and not card.health_reason.startswith(NVML_FAILED)
