"""The compact view of a node that placement works on, fed by the live ledger or by the simulator.

A ``NodeState`` says what is *free* now: per card the compute (per-mille) and memory (MiB) left,
whether nobody holds it and, where slots are counted, how many kubelet slots are free (a card with
none is full for new holders); for the node as a whole the CPU and memory left when they are known.
It carries the interconnect as a ``Topology`` so that multi-card choice can look at it. Its cards
are ``room.CardState`` values, which every fit reads (``room.refusal``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuledger_core.fit import card_states
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Isolation, Link, Node, PcieLevel
from gpuledger_core.room import UNTRACKED as UNTRACKED
from gpuledger_core.room import CardState as CardState
from gpuledger_core.slots import slots_held


@dataclass(frozen=True, slots=True)
class Topology:
    """Pairwise links of a node's cards, by position in ``NodeState.cards``.

    ``nvlinks[i][j]`` counts NVLinks, ``pcie[i][j]`` is the PCIe level (lower is closer).
    """

    nvlinks: tuple[tuple[int, ...], ...]
    pcie: tuple[tuple[int, ...], ...]

    @staticmethod
    def flat(size: int) -> Topology:
        """No NVLink, every pair across the system: nothing to prefer."""
        row = tuple(int(PcieLevel.SYSTEM) for _ in range(size))
        return Topology(tuple((0,) * size for _ in range(size)), tuple(row for _ in range(size)))

    @property
    def uniform(self) -> bool:
        """Whether every pair of cards is connected alike (then only NUMA can tell sets apart)."""
        pairs = {
            (self.nvlinks[i][j], self.pcie[i][j])
            for i in range(len(self.nvlinks))
            for j in range(i + 1, len(self.nvlinks))
        }
        return len(pairs) <= 1


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    cards: tuple[CardState, ...]
    topology: Topology | None = None
    cpu_free: int = UNTRACKED
    mem_free: int = UNTRACKED
    cpu_total: int = UNTRACKED
    mem_total: int = UNTRACKED
    stale: bool = False
    tags: frozenset[str] = frozenset()  # kinds of card requests it already hosts ("share", "2-gpu")
    mix_isolation: bool = False  # whether a card's holders of one tier take a sharer of another

    @property
    def rooms(self) -> tuple[int, ...]:
        return tuple(card.room for card in self.cards)

    @property
    def models(self) -> frozenset[str]:
        return frozenset(card.model for card in self.cards)

    @property
    def gpu_room(self) -> int:
        """The sum of every card's room, in per-mille."""
        return sum(card.room for card in self.cards)


def flat_node(
    name: str, model: str, cards: int, cpu_milli: int = UNTRACKED, memory_mib: int = UNTRACKED
) -> NodeState:
    """A node of ``cards`` identical idle cards with no known interconnect (the trace's nodes)."""
    return NodeState(
        name,
        tuple(CardState(i, model) for i in range(cards)),
        None,
        cpu_milli,
        memory_mib,
        cpu_milli,
        memory_mib,
    )


_TOPOLOGIES: dict[int, tuple[tuple[Link, ...], tuple[int, ...], Topology]] = {}
_TOPOLOGIES_KEPT = 4096


def topology_of(node: Node) -> Topology:
    """The node's interconnect matrices. A ledger decoded from the same inventory shares the
    inventory's objects, so the matrices are made once per inventory (keyed by the links tuple
    itself, which the cache holds, so its id cannot be reused while cached)."""
    positions = tuple(card.index for card in node.cards)
    known = _TOPOLOGIES.get(id(node.links))
    if known is not None and known[0] is node.links and known[1] == positions:
        return known[2]
    if len(_TOPOLOGIES) >= _TOPOLOGIES_KEPT:
        _TOPOLOGIES.clear()
    made = _topology(node)
    _TOPOLOGIES[id(node.links)] = (node.links, positions, made)
    return made


def _topology(node: Node) -> Topology:
    size = len(node.cards)
    nvlinks = [[0] * size for _ in range(size)]
    pcie = [[int(PcieLevel.SYSTEM)] * size for _ in range(size)]
    position = {card.index: pos for pos, card in enumerate(node.cards)}
    for link in node.links:
        a, b = position.get(link.a), position.get(link.b)
        if a is None or b is None:
            continue
        nvlinks[a][b] = nvlinks[b][a] = link.nvlinks
        pcie[a][b] = pcie[b][a] = int(link.pcie)
    return Topology(tuple(map(tuple, nvlinks)), tuple(map(tuple, pcie)))


def from_ledger(
    ledger: NodeLedger,
    *,
    stale: bool = False,
    cpu_free: int = UNTRACKED,
    mem_free: int = UNTRACKED,
    cpu_total: int | None = None,
    mem_total: int | None = None,
    slots_per_card: int | None = None,
    mix_isolation: bool = False,
) -> NodeState:
    """The state of a live node: what its ledger leaves free, plus node CPU/memory when known.
    With ``slots_per_card`` each card also says how many kubelet slots its holders leave free;
    ``mix_isolation``: whether tenants of different isolation tiers may share a card."""
    node = ledger.node
    cards = card_states(ledger, ledger.use(), slots_held(ledger.allocations), slots_per_card)
    return NodeState(
        node.name,
        cards,
        topology_of(node) if node.links else None,
        cpu_free,
        mem_free,
        node.cpu_milli if cpu_total is None else cpu_total,
        node.memory_mib if mem_total is None else mem_total,
        stale,
        mix_isolation=mix_isolation,
    )


def take(
    node: NodeState,
    positions: Sequence[int],
    core: int,
    mem: int,
    exclusive: bool,
    tier: Isolation = Isolation.NONE,
) -> NodeState:
    """The node after a holder of isolation ``tier`` takes ``core``/``mem`` of each card at
    ``positions``."""
    cards = list(node.cards)
    for pos in positions:
        card = cards[pos]
        slots = card.slots_free - 1 if card.slots_free != UNTRACKED else UNTRACKED
        tiers = card.tiers | {tier}
        if exclusive:
            cards[pos] = replace(card, core_free=0, mem_free=0, idle=False, slots_free=slots, tiers=tiers)
        else:
            cards[pos] = replace(
                card,
                core_free=card.core_free - core,
                mem_free=card.mem_free - mem if card.mem_total != UNTRACKED else card.mem_free,
                idle=False,
                slots_free=slots,
                tiers=tiers,
            )
    return replace(node, cards=tuple(cards))


def charge(node: NodeState, cpu_milli: int, memory_mib: int) -> NodeState:
    """The node after a pod takes ``cpu_milli`` and ``memory_mib`` of its CPU and memory."""
    cpu = node.cpu_free - cpu_milli if node.cpu_free != UNTRACKED else UNTRACKED
    mem = node.mem_free - memory_mib if node.mem_free != UNTRACKED else UNTRACKED
    return replace(node, cpu_free=cpu, mem_free=mem)
