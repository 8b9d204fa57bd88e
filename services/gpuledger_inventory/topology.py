"""Pairwise links from what NVML tells about each card: pure functions, no NVML.

Direct NVLinks are counted by matching each active link's remote PCI bus id with the peer's bus
id (as go-gpuallocator does). On NVSwitch systems every link ends at a switch, so two cards are
joined when the NVLink P2P status between them is OK, by as many links as the lesser of the two
cards' switch links (8x H100 SXM: NV18). The PCIe level comes from the common ancestor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuledger_core.model import Link, PcieLevel

Pair = tuple[int, int]


def normalize_bus_id(bus_id: str) -> str:
    """``0000:3b:00.0`` and ``00000000:3B:00.0`` both become ``00000000:3B:00.0``."""
    domain, _, rest = bus_id.strip().upper().partition(":")
    return f"{domain.zfill(8)}:{rest}" if rest else domain


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs names it: ``0000:3b:00.0``."""
    normal = normalize_bus_id(bus_id)
    return normal[4:].lower()


def pcie_level(raw: int | None) -> PcieLevel:
    """NVML's topology level; an unknown or unreadable level counts as across sockets."""
    if raw is None:
        return PcieLevel.SYSTEM
    try:
        return PcieLevel(raw)
    except ValueError:
        return PcieLevel.SYSTEM


def count_direct(
    remote: Mapping[int, Sequence[str]], bus_ids: Mapping[int, str]
) -> dict[Pair, int]:
    """NVLinks per pair from each card's active GPU-to-GPU links (remote bus ids)."""
    owner = {normalize_bus_id(bus): index for index, bus in bus_ids.items()}
    counts: dict[Pair, int] = {}
    for index, remotes in remote.items():
        for bus in remotes:
            peer = owner.get(normalize_bus_id(bus))
            if peer is None or peer <= index:
                continue  # each pair counted from its lower index; links to itself are nonsense
            counts[(index, peer)] = counts.get((index, peer), 0) + 1
    return counts


def count_switched(switch_links: Mapping[int, int], joined: set[Pair]) -> dict[Pair, int]:
    return {(a, b): min(switch_links.get(a, 0), switch_links.get(b, 0)) for a, b in joined}


def build_links(
    indexes: Sequence[int], pcie: Mapping[Pair, PcieLevel], nvlinks: Mapping[Pair, int]
) -> tuple[Link, ...]:
    """One link for every pair of the given cards (missing values: no NVLink, across sockets)."""
    return tuple(
        Link(a, b, nvlinks.get((a, b), 0), pcie.get((a, b), PcieLevel.SYSTEM))
        for a, b in pairs(indexes)
    )


def pairs(indexes: Sequence[int]) -> list[Pair]:
    ordered = sorted(indexes)
    return [(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1 :]]
