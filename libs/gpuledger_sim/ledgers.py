"""The trace's nodes as ledgers, for the replays that place through the ledger (the timeline's
cluster, the FGD replay's defragmentation): every card of a model alike, with ``CARD_MEMORY_MIB``
of memory that no share asks for (the trace gives shares by compute alone, ``gpu_milli``)."""

from __future__ import annotations

from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Card, Node
from gpuledger_sim.trace import TraceNode

CARD_MEMORY_MIB = 16 * 1024  # the trace has no GPU memory; shares ask none of it


def ledger_of(node: TraceNode) -> NodeLedger:
    """An empty ledger of the trace node."""
    name = NodeName(node.name)
    cards = tuple(Card(CardUuid(f"{name}/{i}"), i, node.model, CARD_MEMORY_MIB) for i in range(node.gpus))
    return NodeLedger(Node(name, cards, cpu_milli=node.cpu_milli, memory_mib=node.memory_mib))
