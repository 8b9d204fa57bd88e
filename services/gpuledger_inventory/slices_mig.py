"""A card in MIG mode as partitionable devices (KEP-4815, ``resource.k8s.io/v1``): pure, raw JSON.

Each such card has one ``CounterSet`` in a counters-only slice of the node's pool, ``gpu-<i>-mig``,
whose counters are NVIDIA's layout rules (``mig_layout``): one per memory slice (``memory-slice-<k>``,
value 1: two instances never share one), the media engines the card has left (``decoders``,
``jpegs``, ``ofas``: what the whole-card profile has, less what the instances that exist hold), and,
for a profile whose placements alone would allow more than its instance count, ``count-<profile>``.
Every placement of every profile of the card's model is a device (``dra_mig.device_name``) that
consumes the memory slices it covers and, when it is not an instance that exists already, its
engines and its count: kube-scheduler then allocates only placements that fit beside each other.

Which placements are published: an instance that exists (static or made on demand) is published as
itself; a placement that is not is published only where NVIDIA's rules let it be made beside the
instances that exist (``mig_layout.fits_at``): one overlapping an instance could only be had by
destroying that instance, which gpuledger never does to a static one, and the ledger refuses until
an unheld on-demand one is gone. Taints, as for cards: the card unhealthy, or the instance faulted
(``MigInstance.fault``), ``gpu.gpuledger.io/unhealthy`` (NoSchedule); a placement that overlaps one a
pod or a tool holds in the ledger, or no longer fits beside what they hold,
``gpu.gpuledger.io/held``. The ledger refuses the same placements; the taints keep kube-scheduler
from choosing them (mode B) and tell a person why.

Attributes: the card's (``uuid``, ``index``, ``minor``, ``model``, ...: the parent card), and
``profile``, ``migStart``, ``migSize`` (memory slices), ``computeSlices``, ``memoryMiB`` (the
profile's); capacities ``memory`` (the profile's bytes) and ``compute`` (its compute slices in whole
percent of the card's, rounded down), so a claim may ask ``capacity.requests`` of them. Devices are
ordered smallest profile first (kube-scheduler allocates first-fit: a capacity ask gets the smallest
that holds it), instances that exist before new placements of their profile, then by card, last
start first (which keeps the lower, larger placements whole, as gpuledger's chooser does on an
empty card).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuledger_core.dra_mig import device_name, profile_label
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.mig import model_of, placed
from gpuledger_core.mig_layout import fits_at
from gpuledger_core.mig_profiles import GiProfile, MigModel
from gpuledger_core.model import Card, MigInstance, MigSlot, OwnerKind
from gpuledger_inventory.slice_fields import MiB, binary_quantity, held_taint, string, unhealthy_taint

ENGINES = ("decoders", "jpegs", "ofas")
Held = Sequence[tuple[MigSlot, float]]  # placements pods or tools hold, each since when


@dataclass(frozen=True, slots=True)
class Placement:
    """One device of a MIG card: a profile at a start, and the instance there if one exists."""

    card: Card
    model: MigModel
    profile: GiProfile
    start: int
    instance: MigInstance | None = None

    @property
    def slot(self) -> MigSlot:
        return MigSlot(self.profile.name, self.start, self.profile.memory_slices)

    def order(self) -> tuple[int, int, bool, bool, str, int, int]:
        p = self.profile
        new = self.instance is None
        return (p.memory_mib, p.slices, p.name.endswith("+me"), new, p.name, self.card.index, -self.start)


def counter_set_name(card: Card) -> str:
    return f"gpu-{card.index}-mig"


def placements(card: Card) -> list[Placement]:
    """The placements of ``card`` that are published (see the module's note); none for a card not
    in MIG mode or of a model without MIG."""
    model = model_of(card)
    if not card.mig or model is None:
        return []
    existing = {i.slot: i for i in card.instances}
    made = placed(model, existing)
    found: list[Placement] = []
    for profile in model.profiles:
        for start in profile.starts:
            slot = MigSlot(profile.name, start, profile.memory_slices)
            if slot in existing:
                found.append(Placement(card, model, profile, start, existing[slot]))
            elif not any(slot.overlaps(i) for i in existing) and fits_at(model, profile, start, made):
                found.append(Placement(card, model, profile, start))
    return found


def counter_set(card: Card) -> dict[str, Any] | None:
    """The card's ``CounterSet``; None for a card that publishes no MIG devices."""
    model = model_of(card)
    if not placements(card) or model is None:
        return None
    counters = {f"memory-slice-{k}": {"value": "1"} for k in range(model.memory_slices)}
    made = [p for p, _ in placed(model, (i.slot for i in card.instances))]
    for engine in ENGINES:
        left = getattr(model.whole, engine) - sum(getattr(p, engine) for p in made)
        if left > 0:
            counters[engine] = {"value": str(left)}
    for profile in model.profiles:
        left = profile.instances - sum(1 for p in made if p.name == profile.name)
        if _counted(model, profile) and left > 0:
            counters[_count_name(profile)] = {"value": str(left)}
    return {"name": counter_set_name(card), "counters": counters}


def _counted(model: MigModel, profile: GiProfile) -> bool:
    """Whether the profile's instance count limits it more than its placements do."""
    disjoint, end = 0, -1
    for start in sorted(profile.starts):
        if start >= end:
            disjoint, end = disjoint + 1, start + profile.memory_slices
    return disjoint > profile.instances


def _count_name(profile: GiProfile) -> str:
    return f"count-{profile_label(profile.name)}"


def device(
    place: Placement, attributes: Mapping[str, Any], unhealthy_since: float | None, held: Held
) -> dict[str, Any]:
    """One placement's ``Device``: ``attributes`` are its card's (``slices.card_attributes``)."""
    p, card = place.profile, place.card
    attrs = dict(attributes)
    attrs.update({
        "profile": string(p.name),
        "migStart": {"int": place.start},
        "migSize": {"int": p.memory_slices},
        "computeSlices": {"int": p.slices},
        "memoryMiB": {"int": p.memory_mib},
    })  # fmt: skip
    percent = p.slices * 100 // place.model.whole.slices
    capacity = {"memory": {"value": binary_quantity(p.memory_mib * MiB)}, "compute": {"value": str(percent)}}
    out: dict[str, Any] = {
        "name": device_name(card.index, p.name, place.start),
        "attributes": attrs,
        "capacity": capacity,
        "consumesCounters": [{"counterSet": counter_set_name(card), "counters": _consumed(place)}],
    }
    taints = _taints(place, unhealthy_since, held)
    if taints:
        out["taints"] = taints
    return out


def _consumed(place: Placement) -> dict[str, dict[str, str]]:
    p = place.profile
    used = {f"memory-slice-{k}": {"value": "1"} for k in range(place.start, place.start + p.memory_slices)}
    if place.instance is not None:
        return used  # what an instance that exists holds is taken off the counters already
    for engine in ENGINES:
        if getattr(p, engine):
            used[engine] = {"value": str(getattr(p, engine))}
    if _counted(place.model, p):
        used[_count_name(p)] = {"value": "1"}
    return used


def _taints(place: Placement, unhealthy_since: float | None, held: Held) -> list[dict[str, Any]]:
    taints = []
    if not place.card.healthy:
        taints.append(unhealthy_taint(place.card.health_reason, unhealthy_since))
    elif place.instance is not None and place.instance.fault:
        taints.append(unhealthy_taint(place.instance.fault, None))
    blocked = [at for slot, at in held if slot.overlaps(place.slot)]
    if not blocked and held and place.instance is None:
        beside = placed(place.model, [i.slot for i in place.card.instances] + [s for s, _ in held])
        blocked = [] if fits_at(place.model, place.profile, place.start, beside) else [at for _, at in held]
    if blocked:
        taints.append(held_taint(min(blocked)))
    return taints


def held_outside_dra(ledger: NodeLedger | None) -> dict[str, tuple[tuple[MigSlot, float], ...]]:
    """Per card, the MIG placements live allocations other than claims' hold, each with its
    allocation's time (the taint's timeAdded)."""
    held: dict[str, list[tuple[MigSlot, float]]] = {}
    for allocation in ledger.live() if ledger is not None else ():
        if allocation.owner.kind is OwnerKind.CLAIM:
            continue
        for share in allocation.shares():
            if share.mig is not None:
                held.setdefault(share.uuid, []).append((share.mig, allocation.created_at))
    return {uuid: tuple(sorted(slots, key=lambda s: (s[0].start, s[1]))) for uuid, slots in held.items()}
