"""The entry points the services call: place, filter, score.

All take compact ``NodeState`` values (``state.from_ledger`` makes one from a live ``NodeLedger``)
and an ``Ask``; none of them does I/O or keeps state between calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from random import Random

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.fit import share_for
from gpuledger_core.model import CardShare, Node
from gpuledger_core.packing.ask import Ask
from gpuledger_core.packing.basic import (
    BestFit,
    Binpack,
    DotProduct,
    GpuClustering,
    GpuPacking,
    RandomFit,
    Spread,
)
from gpuledger_core.packing.default import Default
from gpuledger_core.packing.engine import choose_node, option_for
from gpuledger_core.packing.fgd import Fgd
from gpuledger_core.packing.fit import Guard, problem
from gpuledger_core.packing.frag import TypicalPod, Workload, without_memory
from gpuledger_core.packing.policy import Policy
from gpuledger_core.packing.state import NodeState

POLICIES = (
    "default",
    "fgd",
    "bestfit",
    "binpack",
    "spread",
    "random",
    "dotprod",
    "gpuclustering",
    "gpupacking",
)
MAX_EXTENDER_SCORE = 10


@dataclass(frozen=True, slots=True)
class Decision:
    node: str
    cards: tuple[int, ...]  # card indexes on that node
    score: float


@dataclass(frozen=True, slots=True)
class NoFit:
    reasons: tuple[tuple[str, str], ...]  # (node, why not), for every node

    def describe(self, limit: int = 5) -> str:
        shown = "; ".join(f"{node}: {why}" for node, why in self.reasons[:limit])
        more = len(self.reasons) - limit
        return shown + (f"; and {more} more node(s)" if more > 0 else "")


def make_policy(name: str, typical: Sequence[TypicalPod] = (), supply: Mapping[str, int] | None = None) -> Policy:
    """The policy called ``name``; ``fgd`` and ``default`` measure fragmentation against the
    ``typical`` pods (recently observed asks: ``frag.typical`` and ``WorkloadTracker``);
    ``default`` also weighs the card models against ``supply``, the cluster's cards per model
    (``scarcity.Scarcity``; without it, that term counts nothing)."""
    simple: dict[str, type[Binpack | Spread | BestFit | RandomFit | DotProduct | GpuClustering | GpuPacking]] = {
        "binpack": Binpack,
        "spread": Spread,
        "bestfit": BestFit,
        "random": RandomFit,
        "dotprod": DotProduct,
        "gpuclustering": GpuClustering,
        "gpupacking": GpuPacking,
    }
    if name in simple:
        return simple[name]()
    if name == "fgd":
        return Fgd(Workload.of(without_memory(typical)))
    if name == "default":
        return Default(Workload.of(typical), supply=supply)
    raise InvalidArgument("policy", f"unknown policy {name!r}; one of {', '.join(POLICIES)}")


def place(
    nodes: Sequence[NodeState],
    ask: Ask,
    policy: Policy,
    *,
    guard: Guard | None = None,
    rng: Random | None = None,
) -> Decision | NoFit:
    """The node and cards for ``ask``, or every node's reason why not."""
    found = choose_node(nodes, ask, policy, guard, rng)
    if found is None:
        return NoFit(tuple((node.name, problem(node, ask, guard) or _policy_refused(node)) for node in nodes))
    at, option = found
    node = nodes[at]
    return Decision(node.name, tuple(node.cards[p].index for p in option.cards), option.score)


def filter_nodes(
    nodes: Sequence[NodeState], ask: Ask, guard: Guard | None = None
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The names of the nodes ``ask`` fits, and for each other node why it does not."""
    fits: list[str] = []
    failed: dict[str, str] = {}
    for node in nodes:
        why = problem(node, ask, guard)
        if why:
            failed[node.name] = why
        else:
            fits.append(node.name)
    return tuple(fits), failed


def score_nodes(nodes: Sequence[NodeState], ask: Ask, policy: Policy, guard: Guard | None = None) -> dict[str, int]:
    """0..10 per node for the extender's prioritize: the best fitting node 10, a misfit 0."""
    return scale({node.name: rate(node, ask, policy, guard) for node in nodes})


def rate(node: NodeState, ask: Ask, policy: Policy, guard: Guard | None = None) -> float | None:
    """The policy's raw score of ``node`` for ``ask`` (higher is better); ``None`` if it does not
    fit. A caller that caches per node combines them with ``scale``."""
    option = option_for(node, ask, policy, guard)
    return None if option is None else option.score


def scale(raw: Mapping[str, float | None]) -> dict[str, int]:
    """Raw scores to 0..10: the best 10, the worst fitting 0 (all 10 when equal), a misfit 0."""
    scores = {name: score for name, score in raw.items() if score is not None}
    if not scores:
        return dict.fromkeys(raw, 0)
    low, high = min(scores.values()), max(scores.values())
    span = high - low
    return {
        name: (
            0
            if name not in scores
            else MAX_EXTENDER_SCORE
            if span == 0
            else round((scores[name] - low) / span * MAX_EXTENDER_SCORE)
        )
        for name in raw
    }


def shares(node: Node, ask: Ask, decision: Decision) -> tuple[CardShare, ...]:
    """The ledger shares for a decision on ``node`` (what the allocator reserves)."""
    if ask.request is None:
        return ()
    by_index = {card.index: card for card in node.cards}
    return tuple(share_for(by_index[i], ask.request) for i in decision.cards)


def _policy_refused(node: NodeState) -> str:
    return f"no card set on {node.name} suits the policy"
