"""Which nodes the allocator tries for a request when it fits on its own.

The built-in order packs: nodes whose cards fit, fullest first, so that whole free cards stay
whole. The placement service's topology- and fragmentation-aware choice replaces it when up.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger_allocator.view import ClusterView
from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.usage import free_of

JUDGED_KEPT = 50_000


def _judge(ledger: NodeLedger, asks: Sequence[ContainerAsk]) -> float | None:
    try:
        fit_node(ledger, asks)
    except Exhausted:
        return None
    return _free_share(ledger)


def _free_share(ledger: NodeLedger) -> float:
    use = ledger.use()
    total = sum(c.memory_mib for c in ledger.node.cards) or 1
    return sum(free_of(c, use.get(c.uuid)).mem_mib for c in ledger.node.cards) / total


class BuiltinPlacer:
    def __init__(self) -> None:
        # (node, revision, asks) -> free share if the asks fit, else None: a node is judged
        # again only when its ledger changed or the request is new.
        self._judged: dict[tuple[NodeName, int, tuple[ContainerAsk, ...]], float | None] = {}

    async def candidates(self, view: ClusterView, asks: Sequence[ContainerAsk]) -> list[NodeName]:
        fitting: list[tuple[bool, float, NodeName]] = []
        if len(self._judged) > JUDGED_KEPT:
            self._judged.clear()
        for name, ledger in view.ledgers.items():
            key = (name, view.revisions.get(name, 0), tuple(asks))
            if key not in self._judged:
                self._judged[key] = _judge(ledger, asks)
            share = self._judged[key]
            if share is not None:
                fitting.append((view.store.busy(name), share, name))
        # Fullest first; a node this process is writing right now goes after the idle ones, so
        # concurrent requests spread instead of queueing on one key.
        return [name for *_, name in sorted(fitting)]
