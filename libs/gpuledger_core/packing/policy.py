"""What a node policy is: a score for one fitting node (higher is better) and the cards it uses.

Policies see one node at a time and nothing else, so a caller may cache a node's score until that
node changes. Ties between nodes go to the node that comes first in the caller's order (the
simulator orders nodes by a seeded permutation, as the FGD simulator's node-name prefixes do). A
``randomized`` policy ignores scores: any fitting node, uniformly.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import Protocol

from gpuledger_core.packing.ask import Ask
from gpuledger_core.packing.state import NodeState


@dataclass(frozen=True, slots=True)
class Option:
    """A node's answer to an ask: its score and the positions of the cards it would use."""

    score: float
    cards: tuple[int, ...]


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def randomized(self) -> bool: ...

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        """Score ``node`` for ``ask``; ``None`` when its cards cannot hold it.

        The caller has already checked the node's CPU, memory, staleness and guard.
        """
        ...

    def finalize(self, node: NodeState, ask: Ask, option: Option, rng: Random | None) -> Option:
        """The option to commit once ``node`` has been chosen (a policy may re-draw its cards)."""
        ...


class Base:
    """Defaults: scores count, and ``finalize`` keeps the evaluated cards."""

    randomized = False

    def finalize(self, node: NodeState, ask: Ask, option: Option, rng: Random | None) -> Option:
        return option
