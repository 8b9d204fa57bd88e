"""Placement: which node and which cards, for one ask, under a named policy. Pure: no I/O.

Services call ``place``, ``filter_nodes`` and ``score_nodes`` over ``NodeState`` values made with
``from_ledger``; the trace replay drives the same policies through the incremental ``Placer``.
"""

from gpuledger_core.placement.api import (
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
from gpuledger_core.placement.ask import Ask, gpu_ask
from gpuledger_core.placement.engine import Placer
from gpuledger_core.placement.fit import Guard
from gpuledger_core.placement.frag import TypicalPod, Workload, WorkloadTracker, typical
from gpuledger_core.placement.policy import Option, Policy
from gpuledger_core.placement.state import CardState, NodeState, Topology, flat_node, from_ledger

__all__ = [
    "POLICIES",
    "Ask",
    "CardState",
    "Decision",
    "Guard",
    "NoFit",
    "NodeState",
    "Option",
    "Placer",
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
