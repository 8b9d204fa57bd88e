"""Simple node policies: binpack, spread, and the FGD paper's baselines.

The baselines (``bestfit``, ``random``, ``dotprod``, ``gpuclustering``, ``gpupacking``) follow the
FGD simulator's score plugins, integer truncation included, so that the trace replay compares
like with like. Card choice is the built-in one (``cards.choose``: tightest card for a shared ask,
best-connected set otherwise), which is the simulator's "best" card selection on the trace.
"""

from __future__ import annotations

from random import Random

from gpuledger_core.model import CORE_WHOLE
from gpuledger_core.packing.ask import Ask
from gpuledger_core.packing.cards import choose
from gpuledger_core.packing.fit import fitting
from gpuledger_core.packing.policy import Base, Option
from gpuledger_core.packing.state import UNTRACKED, NodeState

MAX_SPEC_CPU = 128_000  # the simulator's normalisers: the largest node's CPU and GPU
MAX_SPEC_GPU = 8 * CORE_WHOLE


def gpu_taken(ask: Ask) -> int:
    """Per-mille of cards the ask takes in total (whole cards count 1000 each)."""
    return ask.count * (CORE_WHOLE if ask.exclusive else max(ask.core, 1))


def cpu_free(node: NodeState) -> int:
    return 0 if node.cpu_free == UNTRACKED else node.cpu_free


def _cards(node: NodeState, ask: Ask) -> tuple[int, ...] | None:
    return choose(node, ask) if ask.count else ()


class Binpack(Base):
    """Fill the fullest node first: least GPU room left after, then least CPU left."""

    name = "binpack"

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        cards = _cards(node, ask)
        if cards is None:
            return None
        left = node.gpu_room - gpu_taken(ask)
        return Option(-left - (cpu_free(node) - ask.cpu_milli) / MAX_SPEC_CPU, cards)


class Spread(Base):
    """Use the emptiest node first."""

    name = "spread"

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        cards = _cards(node, ask)
        if cards is None:
            return None
        return Option(node.gpu_room + cpu_free(node) / MAX_SPEC_CPU, cards)


class BestFit(Base):
    """The least weighted free CPU and GPU left after placing (FGD paper's BestFit)."""

    name = "bestfit"

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        cards = _cards(node, ask)
        if cards is None:
            return None
        cpu_left = (cpu_free(node) - ask.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (node.gpu_room - gpu_taken(ask)) / MAX_SPEC_GPU
        return Option(float(int((1.0 - 0.5 * cpu_left - 0.5 * gpu_left) * 100)), cards)


class RandomFit(Base):
    """Any fitting node, and for a shared ask any fitting card, uniformly."""

    name = "random"
    randomized = True

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        cards = _cards(node, ask)
        return None if cards is None else Option(0.0, cards)

    def finalize(self, node: NodeState, ask: Ask, option: Option, rng: Random | None) -> Option:
        if rng is None or not ask.shared or ask.count != 1:
            return option
        return Option(option.score, (rng.choice(fitting(node, ask)),))


class DotProduct(Base):
    """Tetris-style dot product of free and requested (CPU, GPU), as the FGD simulator scores it:
    the smaller the product, the higher the score."""

    name = "dotprod"

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        cards = _cards(node, ask)
        if cards is None:
            return None
        dot = (cpu_free(node) / MAX_SPEC_CPU) * (ask.cpu_milli / MAX_SPEC_CPU)
        dot += (node.gpu_room / MAX_SPEC_GPU) * (gpu_taken(ask) / MAX_SPEC_GPU)
        return Option(float(int(100 * (1 - dot / 2))), cards)


def tag_of(ask: Ask) -> str:
    """The kind of card request (``share``, ``N-gpu``; empty for none)."""
    if ask.count == 0:
        return ""
    return "share" if ask.shared else f"{ask.count}-gpu"


def _cluster_band(tag: str, tags: frozenset[str] | set[str]) -> int:
    """Only this kind of request already there: 75; mixed with others: 50; idle: 25; others only: 0."""
    if tag in tags:
        return 75 if len(tags) == 1 else 50
    return 25 if not tags else 0


class GpuClustering(Base):
    """Prefer nodes that already host only this kind of card request, then mixed, then idle."""

    name = "gpuclustering"

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        cards = _cards(node, ask)
        if cards is None:
            return None
        tag = tag_of(ask)
        if not tag:
            return Option(0.0, cards)
        used = 25 * (MAX_SPEC_GPU - node.gpu_room) // MAX_SPEC_GPU
        return Option(float(used + _cluster_band(tag, node.tags)), cards)


class GpuPacking(Base):
    """Shared cards first, then free cards on a used node, then a free node."""

    name = "gpupacking"

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        cards = _cards(node, ask)
        if cards is None:
            return None
        if ask.count == 0:
            return Option(0.0, cards)
        idle = sum(1 for card in node.cards if card.idle and card.healthy)
        if idle == len(node.cards):
            return Option(float(max(100 // 3 - idle, idle)), cards)
        # the simulator's own pick: least room first, counting the idle cards it has to use
        ranked = sorted(range(len(node.cards)), key=lambda p: node.cards[p].room)
        use = [p for p in ranked if node.cards[p].room >= max(ask.core, 1)][: ask.count]
        whole = sum(1 for p in use if node.cards[p].idle)
        if whole:
            return Option(float(max(100 // 2 - whole, 100 // 3)), cards)
        free_ratio = sum(node.cards[p].room * 100 // CORE_WHOLE for p in use)
        return Option(float(max(100 - free_ratio // 10, 100 // 2)), cards)
