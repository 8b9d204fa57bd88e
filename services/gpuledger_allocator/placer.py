"""Which nodes the allocator tries for a request when it fits on its own.

The built-in order packs: nodes whose cards fit, fullest first, so that whole free cards stay
whole. The placement service's topology- and fragmentation-aware choice replaces it when up.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.usage import free_of
from gpuledger_allocator.view import ClusterView


def _free_share(ledger: NodeLedger) -> float:
    use = ledger.use()
    total = sum(c.memory_mib for c in ledger.node.cards) or 1
    return sum(free_of(c, use.get(c.uuid)).mem_mib for c in ledger.node.cards) / total


class BuiltinPlacer:
    async def candidates(self, view: ClusterView, asks: Sequence[ContainerAsk]) -> list[NodeName]:
        fitting: list[tuple[float, NodeName]] = []
        for name, ledger in view.ledgers.items():
            try:
                fit_node(ledger, asks)
            except Exhausted:
                continue
            fitting.append((_free_share(ledger), name))
        return [name for _, name in sorted(fitting)]
