"""A MIG placement as a DRA device (pure): the name the node's slices give it and the way back.

A card in MIG mode is published as partitionable devices (KEP-4815): one device per placement of
each profile of its model, named ``gpu-<card index>-mig-<profile>-<start>`` where the profile is
written as a DNS label (lower case, every run of other characters a dash: ``1g.10gb+me`` is
``1g-10gb-me``) and the start is in memory slices. Placement's claims controller (mode B), its claim
allocator (mode C) and the DRA kubelet plugin read a result's device back to the card and the
``MigSlot`` it names (``slot_of``).
"""

from __future__ import annotations

import re

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.mig import model_of
from gpuledger_core.model import Card, MigSlot

_NAME = re.compile(r"gpu-(\d+)-mig-([a-z0-9]+(?:-[a-z0-9]+)*)-(\d+)")


def profile_label(profile: str) -> str:
    """A profile's name as a DNS label: ``1g.10gb+me`` -> ``1g-10gb-me``."""
    return re.sub(r"[^a-z0-9]+", "-", profile.lower()).strip("-")


def device_name(card_index: int, profile: str, start: int) -> str:
    return f"gpu-{card_index}-mig-{profile_label(profile)}-{start}"


def parse(device: str) -> tuple[int, str, int] | None:
    """A MIG device's card index, profile label and start; None for any other device name."""
    found = _NAME.fullmatch(device)
    if found is None:
        return None
    return int(found[1]), found[2], int(found[3])


def is_mig_device(device: str) -> bool:
    return parse(device) is not None


def slot_of(card: Card, device: str) -> MigSlot:
    """The placement ``device`` names on ``card`` (its model's profile whose label it carries),
    or ``InvalidArgument`` saying why there is none."""
    parsed = parse(device)
    if parsed is None or parsed[0] != card.index:
        raise InvalidArgument("device", f"{device} is no MIG placement of card {card.index}")
    _, label, start = parsed
    model = model_of(card)
    profile = next((p for p in model.profiles if profile_label(p.name) == label), None) if model else None
    if profile is None or start not in profile.starts:
        raise InvalidArgument("device", f"{device}: {card.model} has no MIG placement {label} at {start}")
    return MigSlot(profile.name, start, profile.memory_slices)
