"""A card in MIG mode as the listings show it (``gpuledger inspect``, ``kubectl gpuledger``, the
dashboard): its instances, each with who holds it, and the placements held but not made yet.

The status (``gpuledger_core.status``) holds the card's instances (``Card.instances``) and each
holder's placement (``Holder.mig``); an instance's holder is the holder of its placement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuledger_core.model import MigInstance, MigSlot
from gpuledger_core.status import CardStatus, Holder


def slot_text(slot: MigSlot) -> str:
    """``1g.10gb@6``: the profile at its first memory slice."""
    return f"{slot.profile}@{slot.start}"


@dataclass(frozen=True, slots=True)
class Placement:
    """One placement of a card in MIG mode the listings show: an instance that exists (``instance``
    set) and its holder if any, or a placement a holder holds that the node has not made yet."""

    slot: MigSlot
    instance: MigInstance | None
    holder: Holder | None

    @property
    def made(self) -> str:
        """static (made by an operator), on demand (made by gpuledger), or to be made."""
        if self.instance is None:
            return "to be made"
        return "static" if self.instance.static else "on demand"


def placements(c: CardStatus) -> list[Placement]:
    """The card's instances and the placements held without an instance, by start."""
    made = [Placement(i.slot, i, c.holder_of(i)) for i in c.card.instances]
    existing = {i.slot for i in c.card.instances}
    unmade = [Placement(h.mig, None, h) for h in c.holders if h.mig is not None and h.mig not in existing]
    return sorted(made + unmade, key=lambda p: (p.slot.start, p.slot.size, p.slot.profile))


def placement_text(p: Placement, holder: Callable[[Holder], str]) -> str:
    """``3g.20gb@4 static: team-a/train (...)``, ``1g.10gb@0 on demand: free, fault XID 94 [drain]``,
    ``2g.20gb@2 to be made: tool:t2 (...)``; ``holder`` writes the holder."""
    text = f"{slot_text(p.slot)} {p.made}: {holder(p.holder) if p.holder is not None else 'free'}"
    if p.instance is not None and p.instance.fault:
        remedy = f" [{p.instance.remedy.value}]" if p.instance.remedy else ""
        text += f", fault {p.instance.fault}{remedy}"
    return text


def mig_cell(c: CardStatus, holder: Callable[[Holder], str], *, only_held: bool = False) -> str:
    """A card in MIG mode's holders cell: ``MIG`` and its placements (``only_held``: those held by
    the holders shown, as in a namespace's view, where an instance not held by one of them may
    be another namespace's)."""
    shown = [p for p in placements(c) if not only_held or p.holder is not None]
    others = [holder(h) for h in c.holders if h.mig is None]  # not a MIG holder: never on a MIG card, said if so
    parts = [placement_text(p, holder) for p in shown] + others
    return "MIG " + ("; ".join(parts) if parts else "(no instances)")
