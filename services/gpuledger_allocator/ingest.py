"""Inventory and heartbeats from the nodes, into the ledger and the view."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from gpuledger_allocator.view import ClusterView
from gpuledger_common.bus import SUBJECT_PREFIX, decode, subscribed
from gpuledger_common.store import LedgerStore
from gpuledger_core import codec
from gpuledger_core.card_usage import Usage, usage_of
from gpuledger_core.codec import Reader
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger, with_node
from gpuledger_core.model import Node

log = logging.getLogger(__name__)
INVENTORY = f"{SUBJECT_PREFIX}.inventory.*"
HEARTBEAT = f"{SUBJECT_PREFIX}.heartbeat.*"


@dataclass(slots=True)
class Ingest:
    nc: Client
    store: LedgerStore
    view: ClusterView
    _subs: list[Subscription] = field(default_factory=list)

    async def start(self) -> None:
        # A queue group: one replica writes each inventory; every replica sees every heartbeat.
        self._subs.append(await self.nc.subscribe(INVENTORY, queue="allocator-inventory", cb=self._inventory))
        self._subs.append(await self.nc.subscribe(HEARTBEAT, cb=self._heartbeat))
        await subscribed(self.nc)  # inventories published once this returns reach this replica

    async def stop(self) -> None:
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception as err:  # connection already gone
                log.debug("unsubscribe failed: %s", err)
        self._subs.clear()

    async def _inventory(self, msg: Msg) -> None:
        try:
            r = Reader(decode(msg.data))
            node = codec.node_from(r.obj("node"))
        except GpuledgerError as err:
            log.warning("ignoring malformed inventory on %s: %s", msg.subject, err)
            return
        if msg.subject != f"{INVENTORY[:-1]}{node.name}":  # a node speaks for itself only
            log.warning("ignoring an inventory of %s published on %s", node.name, msg.subject)
            return
        self.view.heartbeat(node.name, self.view.clock())
        self.view.usage[node.name] = usage_from(r)
        if self._unchanged(node):
            return
        try:
            await self.store.mutate(node.name, _upsert(node))
            log.info("inventory of %s: %d cards", node.name, len(node.cards))
        except GpuledgerError as err:
            log.warning("could not record the inventory of %s: %s", node.name, err)

    def _unchanged(self, node: Node) -> bool:
        known = self.view.ledgers.get(node.name)
        return known is not None and known.node == node

    async def _heartbeat(self, msg: Msg) -> None:
        try:
            r = Reader(decode(msg.data))
            node = NodeName(r.text("node"))
        except GpuledgerError as err:
            log.warning("ignoring malformed heartbeat on %s: %s", msg.subject, err)
            return
        if msg.subject != f"{HEARTBEAT[:-1]}{node}":
            log.warning("ignoring a heartbeat of %s published on %s", node, msg.subject)
            return
        self.view.heartbeat(node, self.view.clock())


def _upsert(node: Node) -> Callable[[NodeLedger | None], NodeLedger]:
    def transition(ledger: NodeLedger | None) -> NodeLedger:
        return NodeLedger(node) if ledger is None else with_node(ledger, node)

    return transition


def usage_from(r: Reader) -> dict[str, Usage]:
    """Processes per card from the inventory's ``extra.cards`` (absent or malformed: none), each
    with its pod where the inventory attributes them (docs/audit.md)."""
    return usage_of(r.raw.get("extra"))
