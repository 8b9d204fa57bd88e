"""The best-connected cards among those kubelet offers: the local GetPreferredAllocation (pure).

Used when no reservation names the container, or when the placement service does not answer in
time. A container's devices must be on distinct cards; among the sets of ``size`` cards that hold
``must_include``, the best has the most NVLinks between its cards, then the closest worst PCIe
path, then the fewest NUMA nodes, then the lowest card indexes.
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import combinations
from math import comb

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Card, Node
from gpuledger_core.slots import card_of

EXHAUSTIVE_LIMIT = 5000  # card sets scored exactly; beyond this, grow a set greedily


def preferred(node: Node, available: Collection[str], must_include: Collection[str], size: int) -> list[str]:
    by_card = _ids_by_card(node, available, must_include)
    cards = {c.uuid: c for c in node.cards if c.uuid in by_card}
    fixed = [cards[u] for u in {card_of(i) for i in must_include} if u in cards]
    spare = sorted((c for c in cards.values() if c not in fixed), key=lambda c: c.index)
    wanted = size - len(fixed)
    if wanted <= 0 or wanted > len(spare):
        return sorted(must_include)[:size] if wanted <= 0 else []
    chosen = _best(node, fixed, spare, wanted)
    return [_pick(by_card[c.uuid], must_include) for c in sorted(chosen, key=lambda c: c.index)]


def score(node: Node, cards: Collection[Card]) -> tuple[int, int, int, tuple[int, ...]]:
    """Bigger is better."""
    pairs = [node.link(a.index, b.index) for a, b in combinations(cards, 2)]
    nvlinks = sum(p.nvlinks for p in pairs)
    worst = max((int(p.pcie) for p in pairs), default=0)
    numas = len({c.numa for c in cards})
    return (nvlinks, -worst, -numas, tuple(-c.index for c in sorted(cards, key=lambda c: c.index)))


def _best(node: Node, fixed: list[Card], spare: list[Card], wanted: int) -> list[Card]:
    if comb(len(spare), wanted) <= EXHAUSTIVE_LIMIT:
        best = max(combinations(spare, wanted), key=lambda extra: score(node, [*fixed, *extra]))
        return [*fixed, *best]
    chosen = list(fixed)
    for _ in range(wanted):
        rest = [c for c in spare if c not in chosen]
        chosen.append(max(rest, key=lambda c: score(node, [*chosen, c])))
    return chosen


def _ids_by_card(node: Node, available: Collection[str], must: Collection[str]) -> dict[CardUuid, list[str]]:
    known = {c.uuid for c in node.cards}
    found: dict[CardUuid, list[str]] = {}
    for raw in sorted({*available, *must}):
        try:
            uuid = card_of(raw)
        except InvalidArgument:
            continue
        if uuid in known:
            found.setdefault(uuid, []).append(raw)
    return found


def _pick(ids: list[str], must: Collection[str]) -> str:
    return next((i for i in ids if i in must), ids[0])
