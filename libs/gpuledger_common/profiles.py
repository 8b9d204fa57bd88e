"""Built-in card profiles for simulated fleets, from real systems (see docs/fleet-file.md).

Each profile gives the cards of one node and the links between them, as `nvidia-smi topo -m`
would report them on that system. Memory is what NVML reports, not the marketing figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuledger_core.model import Link, PcieLevel


@dataclass(frozen=True, slots=True)
class CardSpec:
    model: str
    memory_mib: int
    numa: int | None = 0


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    cards: tuple[CardSpec, ...]
    links: tuple[Link, ...]
    cpu_milli: int
    memory_mib: int
    nvswitch: bool = False
    mig: bool = False


def _pcie(a: int, b: int, numa: Callable[[int], int | None], same: PcieLevel) -> PcieLevel:
    return same if numa(a) == numa(b) else PcieLevel.SYSTEM


def _uniform(count: int, nvlinks: int, numa: Callable[[int], int | None], same: PcieLevel) -> tuple[Link, ...]:
    return tuple(Link(a, b, nvlinks, _pcie(a, b, numa, same)) for a in range(count) for b in range(a + 1, count))


def _halves(i: int) -> int:
    return 0 if i < 4 else 1


def _h100_sxm_8() -> Profile:
    cards = tuple(CardSpec("NVIDIA H100 80GB HBM3", 81559, _halves(i)) for i in range(8))
    return Profile("h100-sxm-8", cards, _uniform(8, 18, _halves, PcieLevel.NUMA_NODE), 224000, 2097152, nvswitch=True)


def _a100_sxm_8() -> Profile:
    cards = tuple(CardSpec("NVIDIA A100-SXM4-80GB", 81920, _halves(i)) for i in range(8))
    return Profile("a100-sxm-8", cards, _uniform(8, 12, _halves, PcieLevel.NUMA_NODE), 256000, 1048576, nvswitch=True)


# DGX-1 with V100: hybrid cube-mesh; (a, b, links). Every GPU has six links in all.
_DGX1_EDGES = (
    (0, 1, 1),
    (0, 2, 1),
    (0, 3, 2),
    (0, 4, 2),
    (1, 2, 2),
    (1, 3, 1),
    (1, 5, 2),
    (2, 3, 2),
    (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1),
    (4, 6, 1),
    (4, 7, 2),
    (5, 6, 2),
    (5, 7, 1),
    (6, 7, 2),
)


def _dgx1_v100() -> Profile:
    cards = tuple(CardSpec("Tesla V100-SXM2-32GB", 32510, _halves(i)) for i in range(8))
    nv = {(a, b): n for a, b, n in _DGX1_EDGES}
    links = tuple(
        Link(a, b, nv.get((a, b), 0), _pcie(a, b, _halves, PcieLevel.NUMA_NODE))
        for a in range(8)
        for b in range(a + 1, 8)
    )
    return Profile("dgx1-v100", cards, links, 80000, 524288)


def _a100_pcie_4() -> Profile:
    # Two NVLink-bridged pairs (0-1, 2-3); pairs hang off one PCIe switch each, one socket.
    cards = tuple(CardSpec("NVIDIA A100-PCIE-40GB", 40960, 0) for _ in range(4))
    bridged = {(0, 1), (2, 3)}
    links = tuple(
        Link(
            a, b, 4 if (a, b) in bridged else 0, PcieLevel.SINGLE_SWITCH if (a, b) in bridged else PcieLevel.HOST_BRIDGE
        )
        for a in range(4)
        for b in range(a + 1, 4)
    )
    return Profile("a100-pcie-4", cards, links, 64000, 524288)


def _rtx3090_1() -> Profile:
    return Profile("rtx3090-1", (CardSpec("NVIDIA GeForce RTX 3090", 24259, 0),), (), 16000, 65536)


def _tesla_p4_2() -> Profile:
    cards = (CardSpec("Tesla P4", 7611, 0), CardSpec("Tesla P4", 7611, 0))
    return Profile("tesla-p4-2", cards, (Link(0, 1, 0, PcieLevel.HOST_BRIDGE),), 16000, 65536)


def _a100_mig_1() -> Profile:
    return Profile("a100-mig-1", (CardSpec("NVIDIA A100-SXM4-40GB", 40960, 0),), (), 32000, 262144, mig=True)


PROFILES: dict[str, Callable[[], Profile]] = {
    "h100-sxm-8": _h100_sxm_8,
    "a100-sxm-8": _a100_sxm_8,
    "dgx1-v100": _dgx1_v100,
    "a100-pcie-4": _a100_pcie_4,
    "rtx3090-1": _rtx3090_1,
    "tesla-p4-2": _tesla_p4_2,
    "a100-mig-1": _a100_mig_1,
}
