"""Fragmentation gradient descent (FGD): place where expected fragmentation grows least.

``Fgd`` is the paper's policy as its simulator scores it: ``int(sigmoid(-growth / 1000) * 100)``,
ties left to the caller. A shared ask tries every card with room and takes the one whose use
fragments least; a whole-card ask takes the set ``cards.choose`` picks.
"""

from __future__ import annotations

import math

from gpuledger_core.packing.ask import Ask
from gpuledger_core.packing.cards import choose, room_after
from gpuledger_core.packing.fit import fitting
from gpuledger_core.packing.frag import FragMeter, Workload
from gpuledger_core.packing.policy import Base, Option
from gpuledger_core.packing.state import UNTRACKED, NodeState


def growth(meter: FragMeter, node: NodeState, ask: Ask) -> tuple[float, tuple[int, ...]] | None:
    """How much the node's fragmentation grows if ``ask`` goes there, and on which cards."""
    card_models = _card_models(node)
    models = node.models
    cpu = node.cpu_free if node.cpu_free == UNTRACKED else node.cpu_free - ask.cpu_milli
    mem = node.mem_free if node.mem_free == UNTRACKED else node.mem_free - ask.memory_mib
    rooms = node.rooms
    before = meter.of(models, node.cpu_free, rooms, card_models, node.mem_free)
    if ask.shared and ask.count == 1:
        best: tuple[float, int] | None = None
        for pos in fitting(node, ask):
            after_rooms = (*rooms[:pos], room_after(node.cards[pos], ask), *rooms[pos + 1 :])
            after = meter.of(models, cpu, after_rooms, card_models, mem)
            if best is None or after < best[0]:
                best = (after, pos)
        return None if best is None else (best[0] - before, (best[1],))
    cards = choose(node, ask) if ask.count else ()
    if cards is None:
        return None
    after_rooms = tuple(
        (0 if ask.exclusive else room_after(node.cards[p], ask)) if p in cards else room
        for p, room in enumerate(rooms)
    )
    return meter.of(models, cpu, after_rooms, card_models, mem) - before, cards


def _card_models(node: NodeState) -> tuple[str, ...] | None:
    models = tuple(card.model for card in node.cards)
    return None if len(set(models)) <= 1 else models


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class Fgd(Base):
    """The FGD paper's policy, faithfully (integer scores, random ties)."""

    name = "fgd"

    def __init__(self, workload: Workload) -> None:
        self.meter = FragMeter(workload)

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        found = growth(self.meter, node, ask)
        if found is None:
            return None
        grown, cards = found
        return Option(float(int(sigmoid(-grown / 1000) * 100)), cards)
