"""MIG fields of a card and a share to and from plain dicts (docs/mig.md, "Schema").

Every MIG field is written only when set, so a card that is not in MIG mode, and every value of
schema 1, is written byte for byte as before; ``gpuledger_core.codec`` calls these only for a card
or share that has them. Reading is tolerant of a field's absence (its default), strict of its type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuledger_core.model import Card, CardMode, MigInstance, MigSlot, Remedy

if TYPE_CHECKING:
    from gpuledger_core.codec import Reader

Json = dict[str, Any]


def slot_to(slot: MigSlot) -> Json:
    return {"profile": slot.profile, "start": slot.start, "size": slot.size}


def slot_from(r: Reader) -> MigSlot:
    return MigSlot(r.text("profile"), r.integer("start"), r.integer("size"))


def instance_to(instance: MigInstance) -> Json:
    out = {**slot_to(instance.slot), "static": instance.static, "uuid": instance.uuid}
    if instance.fault:  # written only when set: a healthy instance's value is as before
        out["fault"] = instance.fault
    if instance.remedy is not Remedy.NONE:
        out["remedy"] = instance.remedy.value
    return out


def instance_from(r: Reader) -> MigInstance:
    slot, static, uuid = slot_from(r), r.flag("static", True), r.text("uuid", "")
    return MigInstance(slot, static, uuid, r.text("fault", ""), r.enum("remedy", Remedy, Remedy.NONE))


def card_mig_to(card: Card, out: Json) -> None:
    """Add the MIG fields of ``card`` to its dict ``out`` (none for a card in whole mode)."""
    if card.mode is not CardMode.WHOLE:
        out["mode"] = card.mode.value
    if card.instances:
        out["instances"] = [instance_to(i) for i in card.instances]


def card_mig_from(r: Reader) -> tuple[CardMode, tuple[MigInstance, ...]]:
    """The mode and instances of the card ``r`` reads."""
    return r.enum("mode", CardMode, CardMode.WHOLE), r.items("instances", instance_from)
