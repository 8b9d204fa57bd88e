"""Room on one card, and the one rule for whether a card takes one card's worth of a request.

Every fit asks ``refusal``: the ledger's ``reserve`` (the last word, inside the write), the
allocator's built-in fit (``fit.fit_node``) and placement's policies (``placement.fit``, so the
filter, prioritize, place, the binder's plan and the trace replay). Each sees a card as a
``CardState`` (what the card's holders leave free, its health, model and free kubelet slots) and a
container's hold on one card as a ``Want``; ``why_not`` says, for a node's cards, why too few take
a request. A card takes a ``Want`` when it is healthy, of one of the wanted models, has a free slot
and, for an exclusive want, is idle; for a shared one, has the memory and compute left and holds
no tenant of another isolation tier (``usage.tier_problem``, unless ``mix``).

The callers differ only in what they put in, written down here:

- **slots**: ``UNTRACKED`` where nobody counts them: the trace, and the ledger's ``reserve``,
  whose value knows no ``slots_per_card``: its writers count the slots in the same write
  (``slots.assign_device_ids``, ``slots.slot_problem``);
- **card memory**: ``mem_total`` ``UNTRACKED`` (the trace's cards carry no memory figure) is never
  short; a live card always has its figure, 0 MiB where the inventory could not read the size,
  and such a card takes no memory share (the ledger would refuse it);
- **model**: the ledger's want names no model (any card): a reservation names its cards, and the
  selector was its writer's to apply (the hinted reservations check it, ``pods.hinted_grants``);
- **the hold**: the ledger's want is the allocation's whole hold on the card (its app containers'
  shares summed, or its largest init container's if larger: ``usage.allocation_use``), exclusive
  when any of its containers takes the card whole (``CardShare.exclusive``); the fits' want is one
  container's request, the pod's containers placed before it counted among the card's holders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from gpuledger_core.model import CORE_WHOLE, Card, CardMode, Isolation, Request
from gpuledger_core.usage import CardUse, free_parts, tier_problem

UNTRACKED = -1  # node CPU or memory, card memory or slots that nobody counts: never a reason to refuse


@dataclass(frozen=True, slots=True)
class CardState:
    """One card as a fit sees it: what its holders leave free (``idle``: nobody holds any of it),
    its health and model, and its free kubelet slots. ``UNTRACKED`` memory or slots: not counted."""

    index: int
    model: str
    core_free: int = CORE_WHOLE
    mem_total: int = UNTRACKED
    mem_free: int = 0
    idle: bool = True
    healthy: bool = True
    numa: int | None = None
    slots_free: int = UNTRACKED  # kubelet slots no holder takes
    tiers: frozenset[Isolation] = frozenset()  # the isolation tiers of its holders
    mig: bool = False  # in MIG mode: it takes MIG instances only (``gpuledger_core.mig``)

    @property
    def open(self) -> bool:
        """Whether a new holder of a share or a whole card could come: healthy, not in MIG mode,
        with a free slot where slots are counted."""
        return self.healthy and self.slots_free != 0 and not self.mig

    @property
    def room(self) -> int:
        """What a new sharer could still get, per-mille of the card (compute and memory alike)."""
        if not self.open:
            return 0
        if self.idle:
            return CORE_WHOLE
        if self.mem_total <= 0:  # memory not counted, or of unknown size: the compute says
            return self.core_free
        return min(self.core_free, self.mem_free * CORE_WHOLE // self.mem_total)


def card_state(card: Card, use: CardUse | None, slots_free: int = UNTRACKED) -> CardState:
    """A live card as its holders (``use``) leave it, with ``slots_free`` kubelet slots."""
    mem, core, idle, tiers = free_parts(card, use)
    healthy, memory = card.healthy, card.memory_mib
    mig = card.mode is CardMode.MIG
    return CardState(card.index, card.model, core, memory, mem, idle, healthy, card.numa, slots_free, tiers, mig)


@dataclass(frozen=True, slots=True)
class Want:
    """One holder's hold on one card: whole (``exclusive``), or ``core`` per-mille and ``mem`` MiB;
    on a card of one of ``models`` (empty: any), by a tenant of ``isolation``."""

    exclusive: bool
    core: int
    mem: int
    models: frozenset[str] = frozenset()
    isolation: Isolation = Isolation.NONE

    @staticmethod
    def of(request: Request, isolation: Isolation = Isolation.NONE) -> Want:
        """One card's worth of ``request`` (an exclusive one counts the whole card's compute)."""
        if request.exclusive:
            return Want(True, CORE_WHOLE, 0, request.models, isolation)
        return Want(False, request.core_milli or 0, request.mem_mib or 0, request.models, isolation)


class Refusal(Enum):
    """Why a card does not take a want, in the order ``refusal`` asks."""

    UNHEALTHY = "unhealthy"
    MODEL = "model"
    MIG = "mig"  # the card is in MIG mode: no share and no whole card
    SLOTS = "slots"
    HELD = "held"  # an exclusive want, and the card has holders
    MEMORY = "memory"
    COMPUTE = "compute"
    TIER = "tier"


def refusal(card: CardState, want: Want, mix: bool = False) -> Refusal | None:
    """Why ``card`` does not take ``want``; ``None`` when it does. The one per-card rule."""
    if not card.healthy:
        return Refusal.UNHEALTHY
    if want.models and card.model not in want.models:
        return Refusal.MODEL
    if card.mig:
        return Refusal.MIG
    if card.slots_free == 0:
        return Refusal.SLOTS
    if want.exclusive:
        return None if card.idle else Refusal.HELD
    if card.mem_free < want.mem and card.mem_total != UNTRACKED:
        return Refusal.MEMORY
    if card.core_free < want.core:
        return Refusal.COMPUTE
    if card.tiers and tier_problem(card.tiers, want.isolation, mix):
        return Refusal.TIER
    return None


def fitting(cards: Sequence[CardState], want: Want, mix: bool = False) -> tuple[int, ...]:
    """Positions of the cards that each take ``want``."""
    return tuple(pos for pos, card in enumerate(cards) if refusal(card, want, mix) is None)


def why_not(cards: Sequence[CardState], want: Want, count: int, mix: bool = False) -> str:
    """A sentence a person understands about why fewer than ``count`` of ``cards`` take ``want``,
    naming the first thing short in the order of ``refusal``."""
    wanted = [c for c in cards if not want.models or c.model in want.models]
    if not wanted:
        models = ", ".join(sorted({c.model for c in cards})) or "no cards"
        return f"no card of model {'|'.join(sorted(want.models))} (has {models})"
    healthy = [c for c in wanted if c.healthy and not c.mig]
    if len(healthy) < count:
        mig = sum(1 for c in wanted if c.mig)
        split = f" ({mig} other(s) in MIG mode, which take MIG instances only)" if mig else ""
        return f"{len(healthy)} healthy card(s) of the {count} needed{split}"
    if want.exclusive:
        return f"{sum(1 for c in healthy if c.idle)} free whole card(s) of the {count} needed"
    slotted = [c for c in healthy if c.slots_free != 0]
    full = len(healthy) - len(slotted)
    if len(slotted) < count:
        return (
            f"slots used up: {full} card(s) have every kubelet slot held, "
            f"{len(slotted)} card(s) with a free slot of the {count} needed"
        )
    clashes = [why for c in slotted if (why := tier_problem(c.tiers, want.isolation, mix))]
    if len(slotted) - len(clashes) < count:
        return (
            f"{len(clashes)} card(s) held by another isolation tier ({clashes[0]}), "
            f"{len(slotted) - len(clashes)} card(s) of the {count} needed"
        )
    tiered = [c for c in slotted if not tier_problem(c.tiers, want.isolation, mix)]
    short = _short(tiered, want, count, mix)
    if full:  # the cards that are slot-full are part of why, though another card is named
        short += f"; {full} other card(s) have every kubelet slot held (slots used up)"
    return short


def _short(cards: list[CardState], want: Want, count: int, mix: bool) -> str:
    """What the best of ``cards`` lacks: memory, else compute, else how few have both."""
    if want.mem:
        tracked = [c for c in cards if c.mem_total != UNTRACKED]
        best = max(tracked, key=lambda c: c.mem_free, default=None)
        if best is not None and best.mem_free < want.mem:
            return (
                f"card {best.index} has {best.mem_free} MiB free, "
                f"{want.mem - best.mem_free} MiB short of {want.mem} MiB"
            )
    most = max(cards, key=lambda c: c.core_free)
    if most.core_free < want.core:
        return (
            f"card {most.index} has {most.core_free / 10:g}% compute free, "
            f"{(want.core - most.core_free) / 10:g}% short of {want.core / 10:g}%"
        )
    room = sum(1 for c in cards if refusal(c, want, mix) is None)
    return f"{room} card(s) with room of the {count} needed"
