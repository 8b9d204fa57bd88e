"""Defragmentation (pure, no I/O): a few movable holders moved to other nodes so that a pod that
fits nowhere fits (docs/preemption.md, "Defragmentation").

Moving is preemption whose victims come back: the holders to move are chosen as preemption chooses
victims (``preemption.options``: the smallest sets on the cards the pod needs, by budget-protected
count, then count, then work lost), among the movable holders only, and a set is taken only if
every holder in it fits on another node afterwards (each node's cheapest such set; the node whose
set costs least wins), re-placed one by one (the
largest first) by the same fit as any placement, on the ledgers as they stand with the holders
placed before it and never on the node being cleared. A set that leaves one holder without a
place, or that needs more than ``max_moves`` moves, is no choice: nothing is moved for a pod that
would still not fit, and nothing is moved that would not fit again.

A MIG holder moves as any other: it is re-placed by the MIG fit (a free placement of its profile
on a card in MIG mode elsewhere), and a MIG pod is made room for as preemption makes it (the
holders whose placements overlap the one it would take; docs/mig.md).

What the ledger does not hold (a moved pod's CPU and memory, its node affinity) the caller checks
through ``host``; the replacement pod is placed by the scheduler, not here, so the destination is
a proof that room exists, not a reservation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, AllocState, Grant
from gpuledger_core.pods import PodAsk
from gpuledger_core.preemption import Fit, Holder, options

MOVABLE_PRIORITY = 0  # every movable holder ranks below the pod, whatever its own priority


@dataclass(frozen=True, slots=True)
class Move:
    """A holder to move, and where it fits again (``to``, on ``grants``)."""

    allocation: Allocation
    to: NodeName
    grants: tuple[Grant, ...]


@dataclass(frozen=True, slots=True)
class Repack:
    """The moves that clear room for the pod on ``node``, and the pod's cards there afterwards."""

    node: NodeName
    moves: tuple[Move, ...]
    grants: tuple[Grant, ...]

    def describe(self) -> str:
        return f"{self.node}: " + ", ".join(f"{m.allocation.owner.describe()} -> {m.to}" for m in self.moves)


def ask_of(allocation: Allocation) -> PodAsk | None:
    """What a holder asks, read back from its ledger entry (one grant per container that wants cards,
    ``requests`` in the same order; a MIG holder's, its profile); None for an entry that does not
    say (written before entries recorded their requests): such a holder is never moved."""
    if not allocation.grants or len(allocation.requests) != len(allocation.grants):
        return None
    containers = tuple(
        ContainerAsk(g.container, r, g.init) for g, r in zip(allocation.grants, allocation.requests, strict=True)
    )
    return PodAsk(allocation.owner, containers, allocation.isolation)


def repack(
    ledgers: Sequence[NodeLedger],
    pod: PodAsk,
    movable: Mapping[str, Holder],
    fit: Fit,
    now: float,
    max_moves: int,
    host: Callable[[Allocation, NodeName], bool] = lambda _a, _n: True,
    targets: Collection[NodeName] | None = None,
) -> Repack | None:
    """The fewest moves (then the least work lost, then node order) of ``movable`` holders (by owner
    key) that make ``pod`` fit on one of ``ledgers``, each moved holder fitting on another node; None
    when there is none within ``max_moves``, or when the pod fits somewhere already. ``host``: whether
    a moved holder's pod may run on a node as far as the ledger cannot tell; ``targets``: the nodes the
    pod itself may go to (None: any); every node may take a moved holder."""
    allowed = [ledger for ledger in ledgers if targets is None or ledger.node.name in targets]
    if max_moves <= 0 or any(fit.grants(ledger, pod, ()) is not None for ledger in allowed):
        return None
    ranked = {key: Holder(MOVABLE_PRIORITY, h.protected, h.started_at) for key, h in movable.items()}
    best: tuple[tuple[int, int, float], Repack] | None = None
    for ledger in allowed:
        others = [other for other in ledgers if other.node.name != ledger.node.name]
        for victims in options(ledger, pod, MOVABLE_PRIORITY + 1, ranked, fit, now):  # cheapest first
            if not victims.evict or len(victims.evict) > max_moves:
                continue
            moves = _replaced(victims.evict, others, fit, now, host)
            if moves is None:
                continue
            protected, _, count, _, lost = victims.cost
            key = (protected, count, lost)
            if best is None or key < best[0]:
                best = (key, Repack(ledger.node.name, moves, victims.grants))
            break
    return best[1] if best is not None else None


def _replaced(
    holders: Sequence[Allocation],
    others: Sequence[NodeLedger],
    fit: Fit,
    now: float,
    host: Callable[[Allocation, NodeName], bool],
) -> tuple[Move, ...] | None:
    """Each holder placed on one of ``others`` (the largest first; the node where it leaves the
    least room, as best fit would), or None when one fits nowhere."""
    ledgers = {ledger.node.name: ledger for ledger in others}
    moves: list[Move] = []
    for holder in sorted(holders, key=_size, reverse=True):
        ask = ask_of(holder)
        if ask is None:
            return None
        found: tuple[int, NodeName, tuple[Grant, ...]] | None = None
        for name, ledger in sorted(ledgers.items()):
            if not host(holder, name):
                continue
            grants = fit.grants(ledger, ask, ())
            if grants is None:
                continue
            left = _free_after(ledger, grants)
            if found is None or left < found[0]:
                found = (left, name, grants)
        if found is None:
            return None
        _, name, grants = found
        placed = Allocation(AllocationId(f"moved-{holder.id}"), holder.owner, name, grants, AllocState.RESERVED,
                            holder.isolation, now, now, requests=holder.requests)  # fmt: skip
        ledgers[name] = NodeLedger(ledgers[name].node, (*ledgers[name].allocations, placed))
        moves.append(Move(holder, name, grants))
    return tuple(moves)


def _size(allocation: Allocation) -> tuple[int, int]:
    return (sum(s.mem_mib for s in allocation.shares()), sum(s.core_milli for s in allocation.shares()))


def _free_after(ledger: NodeLedger, grants: tuple[Grant, ...]) -> int:
    """The memory left free on the cards ``grants`` take, once taken (best fit's measure)."""
    use = ledger.use()
    taken = {s.uuid: s.mem_mib for g in grants for s in g.cards}
    left = 0
    for uuid, mib in taken.items():
        card = ledger.node.card(uuid)
        held = use.get(uuid)
        if card is not None:
            left += card.memory_mib - (held.mem_mib if held is not None else 0) - mib
    return left
