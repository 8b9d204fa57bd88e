"""Which cards of a node to take.

Multi-card asks get the set with the best interconnect: most NVLink-connected pairs, then most
NVLinks, then the closest PCIe, then the fewest NUMA nodes; among equals, the set that cuts the
fewest links to the cards left free (so good sets stay whole for later), then the NUMA node that is
already the fuller, then the lowest positions. The search is exact up to ``EXACT_LIMIT`` candidate
cards and a bounded greedy beyond. A shared ask gets the card it fills the most (least left over).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from math import comb

from gpuledger_core.model import CORE_WHOLE
from gpuledger_core.packing.ask import Ask
from gpuledger_core.packing.fit import fitting
from gpuledger_core.packing.state import CardState, NodeState, Topology

EXACT_LIMIT = 16
GREEDY_SEEDS = 24  # seeds tried beyond EXACT_LIMIT: bounds the work to O(seeds * count * cards)

SetKey = tuple[int, ...]


def choose(node: NodeState, ask: Ask) -> tuple[int, ...] | None:
    """Positions of the cards for ``ask`` on ``node``, or ``None`` when it does not fit."""
    candidates = fitting(node, ask)
    if len(candidates) < ask.count:
        return None
    if ask.count == 1 and ask.shared:
        return (tightest(node, candidates, ask),)
    return best_set(node, candidates, ask.count)


def room_after(card: CardState, ask: Ask) -> int:
    """What is left of ``card`` for others once ``ask`` has its share, per-mille."""
    core = card.core_free - ask.core
    if card.mem_total <= 0:
        return core
    return min(core, (card.mem_free - ask.mem) * CORE_WHOLE // card.mem_total)


def tightest(node: NodeState, candidates: Sequence[int], ask: Ask) -> int:
    """The card the shared ask leaves the least of; among equals one already shared, then the one
    whose loss cuts the fewest links to idle cards, then the lowest position."""
    free = _free_positions(node)
    topo = node.topology

    def key(pos: int) -> tuple[int, int, int, int]:
        card = node.cards[pos]
        cut = _cut(topo, (pos,), free) if topo is not None else 0
        return (room_after(card, ask), int(card.idle), cut, pos)

    return min(candidates, key=key)


def best_set(node: NodeState, candidates: Sequence[int], count: int) -> tuple[int, ...]:
    topo = node.topology
    numa = tuple(card.numa for card in node.cards)
    if topo is None and len({numa[p] for p in candidates}) <= 1:
        return tuple(sorted(candidates)[:count])
    topo = topo or Topology.flat(len(node.cards))
    free = _free_positions(node)
    idle = _idle_by_numa(node, free)
    to_free = [sum(topo.nvlinks[a][b] for b in free if b != a) for a in range(len(node.cards))]
    if len(candidates) <= EXACT_LIMIT or comb(len(candidates), count) <= comb(EXACT_LIMIT, 8):
        sets: Sequence[tuple[int, ...]] = list(combinations(sorted(candidates), count))
    else:
        sets = _greedy_sets(topo, numa, sorted(candidates), count)
    return min(sets, key=lambda s: set_key(topo, numa, s, free, idle, to_free))


def set_key(
    topo: Topology,
    numa: Sequence[int | None],
    chosen: Sequence[int],
    free: frozenset[int],
    idle: dict[int | None, int],
    to_free: Sequence[int],
) -> SetKey:
    """Lower is better: see the module docstring for the order. ``to_free[a]`` counts the NVLinks
    from card ``a`` to idle cards, so the links cut from the idle pool come out without a rescan."""
    connected = links = pcie = inside_free = 0
    for i, a in enumerate(chosen):
        row_nv, row_pcie = topo.nvlinks[a], topo.pcie[a]
        for b in chosen[i + 1 :]:
            nv = row_nv[b]
            connected += nv > 0
            links += nv
            pcie += row_pcie[b]
            inside_free += nv * ((a in free) + (b in free))
    cut = sum(to_free[a] for a in chosen) - inside_free
    numas = {numa[p] for p in chosen}
    emptier = sum(idle.get(n, 0) for n in numas)
    return (-connected, -links, pcie, len(numas), cut, emptier, *chosen)


def _cut(topo: Topology, chosen: Sequence[int], free: frozenset[int]) -> int:
    rest = free.difference(chosen)
    return sum(topo.nvlinks[a][b] for a in chosen for b in rest)


def _free_positions(node: NodeState) -> frozenset[int]:
    return frozenset(pos for pos, card in enumerate(node.cards) if card.idle and card.healthy)


def _idle_by_numa(node: NodeState, free: frozenset[int]) -> dict[int | None, int]:
    """Idle cards per NUMA node: choosing where fewer are idle packs the node."""
    counts: dict[int | None, int] = {}
    for pos in free:
        numa = node.cards[pos].numa
        counts[numa] = counts.get(numa, 0) + 1
    return counts


def _greedy_sets(
    topo: Topology, numa: Sequence[int | None], candidates: Sequence[int], count: int
) -> list[tuple[int, ...]]:
    """Bounded search for large nodes: grow a set from each of the first seeds by best gain."""
    out = []
    for seed in candidates[:GREEDY_SEEDS]:
        chosen = [seed]
        while len(chosen) < count:
            rest = [c for c in candidates if c not in chosen]
            chosen.append(min(rest, key=lambda c: _gain_key(topo, numa, chosen, c)))
        out.append(tuple(sorted(chosen)))
    return out


def _gain_key(
    topo: Topology, numa: Sequence[int | None], chosen: Sequence[int], card: int
) -> tuple[int, int, int, int, int]:
    connected = sum(topo.nvlinks[card][c] > 0 for c in chosen)
    links = sum(topo.nvlinks[card][c] for c in chosen)
    pcie = sum(topo.pcie[card][c] for c in chosen)
    other_numa = sum(numa[card] != numa[c] for c in chosen)
    return (-connected, -links, pcie, other_numa, card)
