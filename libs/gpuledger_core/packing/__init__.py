"""Placement: which node and which cards, for one ask, under a named policy. Pure: no I/O.

Services call ``place``, ``filter_nodes`` and ``score_nodes`` over ``NodeState`` values made with
``from_ledger``; the trace replay drives the same policies through the incremental ``NodeChooser``.
"""

from gpuledger_core.packing.api import (
    POLICIES,
    Decision,
    NoFit,
    filter_nodes,
    make_policy,
    place,
    rate,
    scale,
    score_nodes,
    shares,
)
from gpuledger_core.packing.ask import Ask, gpu_ask
from gpuledger_core.packing.engine import NodeChooser
from gpuledger_core.packing.fit import Guard
from gpuledger_core.packing.frag import TypicalPod, Workload, WorkloadTracker, typical
from gpuledger_core.packing.policy import Option, Policy
from gpuledger_core.packing.state import CardState, NodeState, Topology, flat_node, from_ledger

__all__ = [
    "POLICIES",
    "Ask",
    "CardState",
    "Decision",
    "Guard",
    "NoFit",
    "NodeChooser",
    "NodeState",
    "Option",
    "Policy",
    "Topology",
    "TypicalPod",
    "Workload",
    "WorkloadTracker",
    "filter_nodes",
    "flat_node",
    "from_ledger",
    "gpu_ask",
    "make_policy",
    "place",
    "rate",
    "scale",
    "score_nodes",
    "shares",
    "typical",
]
