"""The part of a preemption's (or a move's) room that is free already, held by a fence from before
the first eviction until the hold is written. Pure: no I/O.

The room a pod needs on a node is what its victims hold there and what is free there now. The
hold (the victims' entries released and the pod's cards reserved, in one compare-and-set) is
written once every victim is evicted; without a fence, the free part is anyone's until then: a
pod bound into it in that instant (the moved pods' own replacements, seen on a real control
plane) leaves the hold no room, and the victims went for nothing. The fence is a reservation of
that free part only, owned by a tool of its own, with the hold's lease: the hold releases it in
its own write, and it lapses by itself if placement dies before that.

- **Per card of the pod's planned grants**: a card nobody holds gets the pod's whole want on it
  (a whole card, exclusively); a card held by others (victims among them) gets what of the pod's
  want is free on it now, or, where the pod wants the card whole, all that is free on it.
- **On a card in MIG mode**, the pod's planned placement's slices that nobody holds now are
  fenced by the largest placements that lie wholly in them and that the card takes beside its
  holders (``mig.takes``: its instance counts, its static instances), largest first, until none
  is left: any placement another pod could take there would overlap one of them or a victim's.
  A fence makes no instance: no container ever asks the node for one.
"""

from __future__ import annotations

from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, reservation
from gpuledger_core.mig import held_slots, model_of, share_of, takes
from gpuledger_core.model import Allocation, Card, CardShare, Grant, MigSlot, Owner, OwnerKind
from gpuledger_core.pods import PodAsk
from gpuledger_core.usage import allocation_use, free_parts

FENCE_TOOL = "gpuledger-preemption-fence"  # the fence's owner id begins so: "<this>:<the pod's owner key>"


def fence_owner(pod: PodAsk) -> Owner:
    return Owner(OwnerKind.TOOL, f"{FENCE_TOOL}:{pod.owner.key}", pod.owner.namespace, pod.owner.name)


def fence(
    ledger: NodeLedger, pod: PodAsk, grants: tuple[Grant, ...], allocation_id: AllocationId, now: float, lease_s: float
) -> Allocation | None:
    """The fence on ``ledger`` for ``pod``'s planned ``grants`` there, or None where none of their
    room is free now (the victims hold all of it)."""
    planned = Allocation(allocation_id, pod.owner, ledger.node.name, grants, isolation=pod.isolation)
    use = ledger.use()
    shares: list[CardShare] = []
    fenced: dict[str, list[MigSlot]] = {}  # per card in MIG mode: the placements fenced so far
    for share in planned.shares():
        card = ledger.node.card(share.uuid)
        if share.mig is not None and card is not None and card.mig:
            shares += _mig_fence(ledger, card, share.mig, fenced.setdefault(card.uuid, []))
    for uuid, want in allocation_use(planned).items():
        card = ledger.node.card(uuid)
        if card is None or card.mig or any(s.mig is not None for s in planned.shares() if s.uuid == uuid):
            continue
        held = use.get(uuid)
        if held is None or held.holders == 0:
            shares.append(CardShare(uuid, card.index, want.mem_mib, want.core_milli, want.exclusive))
            continue
        mem, core, _, _ = free_parts(card, held)
        if not want.exclusive:
            mem, core = min(mem, want.mem_mib), min(core, want.core_milli)
        if mem > 0 or core > 0:
            shares.append(CardShare(uuid, card.index, mem, core))
    if not shares:
        return None
    return reservation(
        allocation_id,
        fence_owner(pod),
        ledger.node.name,
        (Grant("", tuple(shares)),),
        (),
        isolation=pod.isolation,
        now=now,
        lease_s=lease_s,
    )


def _mig_fence(ledger: NodeLedger, card: Card, slot: MigSlot, fenced: list[MigSlot]) -> list[CardShare]:
    """The placements that fence ``slot``'s slices nobody holds now on ``card`` (``fenced``: those
    chosen for the pod's other placements there, extended with these)."""
    model = model_of(card)
    if model is None:
        return []
    held = held_slots(ledger.allocations, card)
    inside = sorted(
        (
            (p, MigSlot(p.name, start, p.memory_slices))
            for p in model.profiles
            if not p.name.endswith("+me")
            for start in p.starts
            if slot.start <= start and start + p.memory_slices <= slot.start + slot.size
        ),
        key=lambda found: (-found[1].size, found[1].start),
    )
    shares = []
    for profile, candidate in inside:
        if not takes(card, model, candidate, held + fenced):
            fenced.append(candidate)
            shares.append(share_of(card, profile, candidate.start))
    return shares
