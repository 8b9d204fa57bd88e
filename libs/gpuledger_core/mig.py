"""The ledger's MIG rules: which placement of which profile a holder may take on a card in MIG
mode, and which profile a request means on a card model (docs/mig.md).

A card in MIG mode is a set of placements. Its instances are the GPU instances that exist (the
node's inventory reports them: ``Card.instances``), made by an operator (static) or by gpuledger
(on demand); its holders each hold one placement whole (``CardShare.mig``). A holder takes:

- an existing instance of its profile that no one holds (static or on demand: the same slot), or
- a free placement of its profile, made on demand: one of the profile's starts whose memory
  slices no holder and no static instance occupies, within the profile's instance count and the
  card's media engines (``mig_layout.fits_at``, NVIDIA's rules). An instance made on demand that
  no one holds (kept for reuse) is no obstacle: the node destroys it to make the new one
  (``reclaimed``), as it would once its keep ran out.

Nothing else: a share or a whole-card holder never goes on a card in MIG mode, and a MIG holder
never on a card that is not (``room.Refusal.MIG``, ``mig_problem``).

A request names a profile (``gpuledger.io/mig-<profile>``), or memory and compute, for which each
card model's smallest profile that holds both is meant (``smallest``): the fewest memory slices,
then the fewest compute slices, among the profiles without media engines (``+me`` profiles are
asked for by name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.mig_layout import Placed, fits_at
from gpuledger_core.mig_profiles import MODELS, GiProfile, MigModel, mig_model
from gpuledger_core.model import CORE_WHOLE, MIG_SMALLEST, Allocation, Card, CardShare, MigSlot, Node, Request

RESOURCE_PREFIX = "gpuledger.io/mig-"  # gpuledger.io/mig-1g.10gb: N instances of 1g.10gb, one per card
RESOURCE = "gpuledger.io/mig"  # N instances, one per card, each the smallest holding gpu-mem and gpu-core
PROFILES = frozenset(p.name for m in MODELS for p in m.profiles)  # every profile some card model offers
_BY_RESOURCE = {p.replace("+", "."): p for p in PROFILES if "+" in p}  # 1g.10gb.me -> 1g.10gb+me


def model_of(card: Card) -> MigModel | None:
    """The card's MIG table, or None for a card model without MIG."""
    return mig_model(card.model, card.memory_mib)


def placement_text(slot: MigSlot, index: int, uuid: str) -> str:
    """``MIG instance 1g.10gb at 6 on card 0 (GPU-...)``: how errors and events name a placement."""
    return f"MIG instance {slot.profile} at {slot.start} on card {index} ({uuid})"


def unknown_profile(profile: str) -> str:
    """Why ``profile`` cannot be asked for (no card model offers it), naming those that can; empty
    when some card model offers it."""
    if profile in PROFILES:
        return ""
    return f"no card model offers the MIG profile {profile or '(none named)'} (known: {', '.join(sorted(PROFILES))})"


def resource_of(profile: str) -> str:
    """The resource that asks for instances of ``profile``: ``gpuledger.io/mig-<profile>``, a
    ``+me`` profile's ``+`` written ``.`` (``gpuledger.io/mig-1g.10gb.me``), since a resource name
    allows only letters, digits, ``-``, ``_`` and ``.`` (NVIDIA's device plugin writes it so too)."""
    return f"{RESOURCE_PREFIX}{profile.replace('+', '.')}"


def profile_of_resource(name: str) -> str | None:
    """The profile a ``gpuledger.io/mig-<profile>`` resource names (``resource_of`` read back; an
    unknown name as written); None for any other resource."""
    if not name.startswith(RESOURCE_PREFIX):
        return None
    written = name[len(RESOURCE_PREFIX) :]
    return _BY_RESOURCE.get(written, written) or None


def is_resource(name: str) -> bool:
    return name == RESOURCE or name.startswith(RESOURCE_PREFIX)


def request_of(
    counts: Mapping[str, int], mem_mib: int | None, core_milli: int | None, models: frozenset[str] = frozenset()
) -> Request | None:
    """The MIG request of one container: ``counts`` are its MIG resources (``is_resource``), each
    a number of instances; ``mem_mib`` and ``core_milli`` its gpu-mem and gpu-core, which size the
    instances of ``gpuledger.io/mig`` and go with no named profile. None when it asks for none."""
    asked = {name: n for name, n in counts.items() if n}
    if not asked:
        return None
    if len(asked) > 1:
        raise InvalidArgument(" and ".join(sorted(asked)), "ask for one MIG resource per container")
    ((name, count),) = asked.items()
    if name == RESOURCE:
        if mem_mib is None and core_milli is None:
            raise InvalidArgument(
                name, "sizes its instances by gpuledger.io/gpu-mem or gpuledger.io/gpu-core: give one"
            )
        return Request(count, mem_mib, core_milli, models, mig=MIG_SMALLEST)
    profile = profile_of_resource(name) or ""
    unknown = unknown_profile(profile)
    if unknown:
        raise InvalidArgument(name, unknown)
    if mem_mib is not None or core_milli is not None:
        raise InvalidArgument(name, "names its memory and compute: give no gpuledger.io/gpu-mem or gpu-core beside it")
    return Request(count, models=models, mig=profile)


def smallest(model: MigModel, mem_mib: int | None, core_milli: int | None) -> GiProfile | None:
    """The smallest profile of ``model`` with at least ``mem_mib`` of memory and ``core_milli``
    per-mille of the card's compute (its compute slices of the whole card's); None if none does."""
    whole = model.whole.slices
    mem, core = mem_mib or 0, core_milli or 0
    fits = [
        p
        for p in model.profiles
        if not p.name.endswith("+me") and p.memory_mib >= mem and p.slices * CORE_WHOLE >= core * whole
    ]
    return min(fits, key=lambda p: (p.memory_slices, p.slices, p.memory_mib), default=None)


def profile_for(model: MigModel, request: Request) -> GiProfile | None:
    """The profile ``request`` means on a card of ``model``: the one it names, or the smallest
    that holds its memory and compute; None when the model has none such."""
    if request.mig == MIG_SMALLEST:
        return smallest(model, request.mem_mib, request.core_milli)
    return model.by_name(request.mig)


def share_of(card: Card, profile: GiProfile, start: int) -> CardShare:
    """A holder's share of one placement: the profile's memory and its part of the compute."""
    whole = model_of(card)
    slices = whole.whole.slices if whole else profile.slices
    core = profile.slices * CORE_WHOLE // slices
    slot = MigSlot(profile.name, start, profile.memory_slices)
    return CardShare(card.uuid, card.index, profile.memory_mib, core, False, slot)


def held_slots(allocations: Iterable[Allocation], card: Card) -> list[MigSlot]:
    """The placements the live allocations hold on ``card``."""
    return [
        s.mig
        for a in allocations
        if a.live
        for g in a.grants
        for s in g.cards
        if s.mig is not None and s.uuid == card.uuid
    ]


def occupied(card: Card, held: Sequence[MigSlot]) -> list[MigSlot]:
    """Every placement that takes memory slices of ``card``: its instances and what is held (an
    instance held counts once)."""
    slots = [i.slot for i in card.instances]
    return slots + [s for s in held if s not in slots]


def reclaimed(card: Card, held: Sequence[MigSlot], slot: MigSlot) -> frozenset[MigSlot]:
    """The instances of ``card`` that making ``slot`` destroys: made on demand, held by no one,
    overlapping it (an instance at ``slot`` itself is taken as it is, not made again)."""
    return frozenset(
        i.slot
        for i in card.instances
        if not i.static and i.slot not in held and i.slot != slot and i.slot.overlaps(slot)
    )


def staying(card: Card, held: Sequence[MigSlot], slot: MigSlot) -> list[MigSlot]:
    """What occupies ``card`` once ``slot`` is made: ``occupied`` but what making it destroys."""
    gone = reclaimed(card, held, slot)
    return [s for s in occupied(card, held) if s not in gone]


def placed(model: MigModel, slots: Iterable[MigSlot]) -> list[Placed]:
    """Slots as ``mig_layout`` counts them (a slot of a profile the model lacks is left out: it was
    refused when it was taken, and an instance the inventory reports is there whatever it is)."""
    found = ((model.by_name(s.profile), s.start) for s in slots)
    return [(p, start) for p, start in found if p is not None]


def free_instances(card: Card, held: Sequence[MigSlot], profile: str) -> list[MigSlot]:
    """The card's healthy instances of ``profile`` that no one holds, lowest start first."""
    return sorted((s for s in unheld(card, held) if s.profile == profile), key=lambda s: s.start)


def unheld(card: Card, held: Sequence[MigSlot]) -> list[MigSlot]:
    """The card's healthy instances that no one holds, nor overlaps (a placement held over an
    unheld instance made on demand destroys it)."""
    return [i.slot for i in card.instances if not i.fault and not any(h.overlaps(i.slot) for h in held)]


def free_starts(card: Card, model: MigModel, profile: GiProfile, held: Sequence[MigSlot]) -> list[int]:
    """The starts where an instance of ``profile`` could be made now (``mig_layout.fits_at``),
    unheld on-demand instances in the way destroyed (``reclaimed``)."""
    return [
        s
        for s in profile.starts
        if fits_at(
            model, profile, s, placed(model, staying(card, held, MigSlot(profile.name, s, profile.memory_slices)))
        )
    ]


def takes(card: Card, model: MigModel, slot: MigSlot, held: Sequence[MigSlot]) -> str:
    """Why ``slot`` may not be taken on ``card`` beside the ``held`` placements; empty when it may."""
    profile = model.by_name(slot.profile)
    if profile is None:
        offered = ", ".join(p.name for p in model.profiles)
        return f"{card.model} offers no MIG profile {slot.profile} (it offers {offered})"
    if slot.size != profile.memory_slices or slot.start not in profile.starts:
        return f"{slot.profile} has no placement at {slot.start} of size {slot.size} on {card.model}"
    clash = next((h for h in held if h.overlaps(slot)), None)
    if clash is not None:
        return f"{slot.profile} at {slot.start} overlaps {clash.profile} at {clash.start}, which is held"
    existing = next((i for i in card.instances if i.slot == slot), None)
    if existing is not None:  # an instance that exists, free: taken as it is, unless it is faulted
        if existing.fault:
            where = f"{slot.profile}@{slot.start}"
            return f"MIG instance {where} on card {card.index} is unhealthy: {existing.fault}"
        return ""
    made = next((i.slot for i in card.instances if i.static and i.slot.overlaps(slot)), None)
    if made is not None:
        return f"{slot.profile} at {slot.start} overlaps the static instance {made.profile} at {made.start}"
    if not fits_at(model, profile, slot.start, placed(model, staying(card, held, slot))):
        return f"no more {slot.profile} fit beside what the card has (its instance count or media engines)"
    return ""


def mig_problem(node: Node, allocations: Sequence[Allocation], shares: Sequence[CardShare]) -> str:
    """Why the MIG ``shares`` of a new allocation do not fit beside the live ``allocations``;
    empty when they do. Shares of one card are taken in turn, each beside the ones before it."""
    taken: dict[str, list[MigSlot]] = {}
    for share in shares:
        assert share.mig is not None
        card = node.card(share.uuid)
        if card is None:
            return f"card {share.uuid} is not on node {node.name}"
        why = _card_problem(card, share.mig, taken, allocations)
        if why:
            return f"card {card.index} ({card.uuid}) on {node.name}: {why}"
        taken.setdefault(card.uuid, []).append(share.mig)
    return ""


def _card_problem(card: Card, slot: MigSlot, taken: dict[str, list[MigSlot]], allocations: Sequence[Allocation]) -> str:
    if not card.mig:
        return f"is in {card.mode} mode, not MIG: it takes no MIG instance ({slot.profile})"
    if not card.healthy:
        return "is unhealthy"
    model = model_of(card)
    if model is None:
        return f"{card.model} has no MIG"
    held = held_slots(allocations, card) + taken.get(card.uuid, [])
    return takes(card, model, slot, held)


def memory_slices_free(card: Card, held: Sequence[MigSlot]) -> int:
    """The memory slices of ``card`` no instance and no holder occupies."""
    model = model_of(card)
    if model is None:
        return 0
    return model.memory_slices - sum(s.size for s in occupied(card, held))
