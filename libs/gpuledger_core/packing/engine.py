"""Choosing a node among many, once (``choose_node``) or over and over (``NodeChooser``).

``NodeChooser`` keeps every node's option per ask shape and recomputes only the nodes that changed since
that shape was last asked for, and it remembers options by node content, so identical nodes are
scored once. Both go through the same policy ``evaluate`` and the same tie-breaking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from random import Random

from gpuledger_core.packing.ask import Ask
from gpuledger_core.packing.fit import Guard, host_fits
from gpuledger_core.packing.policy import Option, Policy
from gpuledger_core.packing.state import NodeState

NONE = float("-inf")
MEMO_LIMIT = 200_000  # options remembered by node content before the memo starts afresh


def option_for(node: NodeState, ask: Ask, policy: Policy, guard: Guard | None) -> Option | None:
    if not host_fits(node, ask, guard):
        return None
    return policy.evaluate(node, ask)


def pick(
    scores: Sequence[float], randomized: bool = False, rng: Random | None = None
) -> int | None:
    """The position of the best score, the first on ties; a ``randomized`` policy with ``rng``
    gets any scored position, uniformly."""
    if randomized and rng is not None:
        scored = [i for i, score in enumerate(scores) if score != NONE]
        return rng.choice(scored) if scored else None
    best = max(scores, default=NONE)
    return None if best == NONE else scores.index(best)


def choose_node(
    nodes: Sequence[NodeState],
    ask: Ask,
    policy: Policy,
    guard: Guard | None = None,
    rng: Random | None = None,
) -> tuple[int, Option] | None:
    """The position of the best node for ``ask`` and its option, or ``None`` if none fits.

    Ties go to the first node in ``nodes``; ``rng`` serves randomized policies only.
    """
    options = [option_for(node, ask, policy, guard) for node in nodes]
    at = pick([NONE if o is None else o.score for o in options], policy.randomized, rng)
    if at is None:
        return None
    found = options[at]
    assert found is not None
    return at, policy.finalize(nodes[at], ask, found, rng)


@dataclass(slots=True)
class _Shape:
    scores: list[float]
    options: list[Option | None]
    synced: int  # position in the change log up to which these are current


@dataclass(slots=True)
class NodeChooser:
    """Incremental node choice over a mutable list of node states (nothing here does I/O)."""

    nodes: list[NodeState]
    policy: Policy
    guard: Guard | None = None
    rng: Random | None = None
    _log: list[int] = field(default_factory=list)
    _shapes: dict[object, _Shape] = field(default_factory=dict)
    _memo: dict[object, Option | None] = field(default_factory=dict)

    def choose(self, ask: Ask) -> tuple[int, Option] | None:
        """The position of the best node for ``ask`` and its option (nothing is committed)."""
        shape = self._refresh(ask)
        at = pick(shape.scores, self.policy.randomized, self.rng)
        if at is None:
            return None
        found = shape.options[at]
        assert found is not None
        return at, self.policy.finalize(self.nodes[at], ask, found, self.rng)

    def update(self, position: int, node: NodeState) -> None:
        """Record a node's new state (after a placement, or news from outside)."""
        self.nodes[position] = node
        self._log.append(position)

    def reset(self) -> None:
        """Forget every cached option (call when the policy's inputs, e.g. its workload, change)."""
        self._shapes.clear()
        self._memo.clear()

    def _refresh(self, ask: Ask) -> _Shape:
        key = ask.shape
        shape = self._shapes.get(key)
        if shape is None:
            options = [self._option(node, ask) for node in self.nodes]
            shape = _Shape(
                [NONE if o is None else o.score for o in options], options, len(self._log)
            )
            self._shapes[key] = shape
            return shape
        for position in set(self._log[shape.synced :]):
            option = self._option(self.nodes[position], ask)
            shape.options[position] = option
            shape.scores[position] = NONE if option is None else option.score
        shape.synced = len(self._log)
        return shape

    def _option(self, node: NodeState, ask: Ask) -> Option | None:
        key = (
            ask.shape,
            node.cards,
            node.cpu_free,
            node.mem_free,
            node.stale,
            node.tags,
            node.topology,
            node.mix_isolation,
        )
        if key in self._memo:
            return self._memo[key]
        option = option_for(node, ask, self.policy, self.guard)
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = option
        return option
