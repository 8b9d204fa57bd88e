"""Tools on a draining card: this replica follows its view of the ledger and, on each node with a
card under repair, marks the tool allocations that hold it, releases them at the end of their
grace and unmarks them if the card serves again first (the decision: ``gpuledger_core.tool_drain``).

Every replica does it; each change is one compare-and-set on the node's key whose transition
finds nothing to do once another replica has done it, so a mark or a release is written once.
The mark (and its ``release_at``) is in the ledger: a restart resumes the count where it was.
Owners are told by the ledger's events (``drain``), which every writer and every Watch derive
from the key's change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuledger_allocator.metrics import TOOL_DRAINS
from gpuledger_allocator.reserving import must
from gpuledger_allocator.view import ClusterView
from gpuledger_common.store import LedgerStore
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.tool_drain import Changes, changes, drain_tools, next_release

log = logging.getLogger(__name__)
SOONEST_S = 0.05  # the shortest wait for a release that is due


@dataclass(slots=True)
class ToolDrains:
    store: LedgerStore
    view: ClusterView
    grace_s: float
    clock: Callable[[], float] = time.time
    _settled: dict[NodeName, int] = field(default_factory=dict)  # revisions with nothing to do or to wait for
    _due: float | None = None  # the next release_at of a marked allocation

    async def run(self, interval_s: float) -> None:
        """A round every ``interval_s``, or sooner when a release is due."""
        while True:
            await self.round()
            await asyncio.sleep(self._wait(interval_s))

    async def round(self) -> int:
        """Write what is due on each node whose key changed since it last had nothing to do (or
        that has a marked allocation); returns how many nodes were written."""
        now, due, written = self.clock(), None, 0
        for name, ledger in list(self.view.ledgers.items()):
            revision = self.view.revisions.get(name, 0)
            if self._settled.get(name) == revision:
                continue
            if drain_tools(ledger, now, self.grace_s) is not ledger:
                written += await self._write(name)
                continue  # the next round reads the node's new value
            at = next_release(ledger)
            if at is None:
                self._settled[name] = revision
            else:
                due = at if due is None else min(due, at)
        for gone in self._settled.keys() - self.view.ledgers.keys():
            del self._settled[gone]
        self._due = due
        return written

    def _wait(self, interval_s: float) -> float:
        if self._due is None:
            return interval_s
        return min(interval_s, max(SOONEST_S, self._due - self.clock()))

    async def _write(self, node: NodeName) -> int:
        try:
            written = await self.store.mutate(node, self._transition(node))
        except Exception as err:  # NATS away, the key kept changing, the node removed: next round
            log.warning("tool drains on node %s not written: %s", node, err)
            return 0
        _report(changes(written.old, written.new))
        return 1

    def _transition(self, node: NodeName) -> Callable[[NodeLedger | None], NodeLedger]:
        return lambda current: drain_tools(must(current, node), self.clock(), self.grace_s)


def _report(done: Changes) -> None:
    for a in done.told:
        TOOL_DRAINS.labels("told").inc()
        assert a.drain is not None
        log.warning(
            "tool allocation %s of %s told to leave; released at %.0f: %s",
            a.id,
            a.owner.describe(),
            a.drain.release_at,
            a.drain.reason,
        )
    for a in done.released:
        TOOL_DRAINS.labels("released").inc()
        log.warning("tool allocation %s of %s released: %s", a.id, a.owner.describe(), a.reason)
    for a in done.cancelled:
        TOOL_DRAINS.labels("cancelled").inc()
        log.info("tool allocation %s of %s stays: its card serves again", a.id, a.owner.describe())
