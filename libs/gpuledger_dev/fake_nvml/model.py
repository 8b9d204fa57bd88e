"""What the fake NVML's node is made of: the chips it knows (``Arch``), its cards with their
NVLinks, MIG instances and processes, the events it queues and the event sets that read them; and
the cards built from a fleet node (``cards_of``), their PCI bus IDs and NVLink peers included.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fleet_script import MigProfile, NodeScript, mig_profiles

MiB = 1024 * 1024
ALL_INSTANCES = 0xFFFFFFFF
XID_FALLEN_OFF_BUS = 79
_SWITCH_BUS_IDS = tuple(f"00000000:{b:02X}:00.0" for b in (0xC5, 0xC6, 0xC7, 0xC8))


@dataclass(frozen=True, slots=True)
class Arch:
    key: str
    capability: tuple[int, int]
    nvlinks: int  # NVLink ports on the chip
    pci_device_id: int
    ecc: bool = True


_ARCHES = (
    Arch("H100", (9, 0), 18, 0x233010DE),
    Arch("H200", (9, 0), 18, 0x233510DE),
    Arch("A100-SXM4-40GB", (8, 0), 12, 0x20B010DE),
    Arch("A100-SXM4-80GB", (8, 0), 12, 0x20B210DE),
    Arch("A100-PCIE", (8, 0), 12, 0x20F110DE),
    Arch("V100", (7, 0), 6, 0x1DB510DE),
    Arch("RTX 3090", (8, 6), 4, 0x220410DE, ecc=False),
    Arch("P4", (6, 1), 0, 0x1BB310DE),
)
_DEFAULT_ARCH = Arch("", (8, 0), 0, 0x20B210DE)


def arch_of(model: str) -> Arch:
    return next((a for a in _ARCHES if a.key in model), _DEFAULT_ARCH)


@dataclass(slots=True)
class FakeMig:
    parent: int
    slot: int
    profile: MigProfile
    uuid: str
    handle: Any = field(default_factory=_nvml.struct_c_nvmlDevice_t)

    @property
    def gi(self) -> int:
        return self.slot + 1


@dataclass(slots=True)
class Ecc:
    """A card's memory errors: counts since the last reset (volatile) and for its life (aggregate),
    and what row remapping or page retirement has pending or failed."""

    volatile: list[int] = field(default_factory=lambda: [0, 0])  # corrected, uncorrected
    aggregate: list[int] = field(default_factory=lambda: [0, 0])
    rows: list[int] = field(default_factory=lambda: [0, 0])  # rows remapped: corrected, uncorrected
    remap_pending: bool = False
    remap_failure: bool = False
    pages_pending: bool = False

    def count(self, double: bool) -> None:
        kind = 1 if double else 0
        self.volatile[kind] += 1
        self.aggregate[kind] += 1

    def reset(self) -> None:
        """What a reset does: volatile counts cleared, a pending remap or retirement applied."""
        self.volatile = [0, 0]
        if self.remap_pending:
            self.rows[1] += 1
        self.remap_pending = self.pages_pending = False


@dataclass(slots=True)
class FakeCard:
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa: int | None
    bus_id: str
    arch: Arch
    links: list[tuple[int, str]]  # (remote device type, remote bus id) per active NVLink
    migs: list[FakeMig] | None  # None: no MIG on this card; []: MIG capable, disabled
    processes: list[tuple[int, int | None, int | None]] = field(
        default_factory=list
    )  # pid, MiB, mig slot
    lost: bool = False
    events_supported: bool = True
    handle: Any = field(default_factory=_nvml.struct_c_nvmlDevice_t)
    ecc: Ecc = field(default_factory=Ecc)
    resets: int = 0  # resets done (the next takes the next scripted one of this card)

    @property
    def remaps_rows(self) -> bool:
        """Ampere and later cards with ECC remap rows; older ones retire pages."""
        return self.arch.ecc and self.arch.capability >= (8, 0)


@dataclass(frozen=True, slots=True)
class FakeReset:
    """What ``nvidia-smi --gpu-reset`` would do: take ``seconds`` (None: never end), then exit."""

    seconds: float | None
    code: int
    output: str


@dataclass(slots=True)
class Event:
    card: int
    kind: int
    data: int
    gi: int = ALL_INSTANCES
    ci: int = ALL_INSTANCES


@dataclass(slots=True)
class EventSet:
    cursor: int
    registered: dict[int, int] = field(default_factory=dict)  # card index -> mask
    handle: Any = field(default_factory=_nvml.struct_c_nvmlEventSet_t)


def cards_of(sim: NodeScript) -> list[FakeCard]:
    """The node's cards as the fake holds them: MIG instances, NVLinks and processes included."""
    cards = [_build_card(sim, i) for i in range(len(sim.node.cards))]
    _link(sim, cards)
    for p in sim.processes:
        cards[p.card].processes.append((p.pid, p.memory_mib, p.mig))
    return cards


def _build_card(sim: NodeScript, i: int) -> FakeCard:
    spec = sim.node.cards[i]
    layout = sim.layout(i)
    migs: list[FakeMig] | None = None
    if mig_profiles(spec.model, spec.memory_mib) is not None:
        migs = []
        for slot, prof in enumerate(layout.instances if layout else ()):
            mig_uuid = f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, f'{spec.uuid}/{slot}')}"
            migs.append(FakeMig(i, slot, prof, mig_uuid))
    arch = arch_of(spec.model)
    bus = spec.pci_bus_id or default_bus_id(i)
    return FakeCard(i, spec.uuid, spec.model, spec.memory_mib, spec.numa, bus, arch, [], migs)


def _link(sim: NodeScript, cards: list[FakeCard]) -> None:
    for link in sim.node.links:
        if link.nvlinks == 0:
            continue
        a, b = cards[link.a], cards[link.b]
        if sim.nvswitch:
            for card in (a, b):
                while len(card.links) < link.nvlinks:
                    card.links.append(
                        (
                            _nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
                            _SWITCH_BUS_IDS[len(card.links) % 4],
                        )
                    )
            continue
        a.links.extend([(_nvml.NVML_NVLINK_DEVICE_TYPE_GPU, b.bus_id)] * link.nvlinks)
        b.links.extend([(_nvml.NVML_NVLINK_DEVICE_TYPE_GPU, a.bus_id)] * link.nvlinks)


def default_bus_id(index: int) -> str:
    return f"00000000:{0x1B + 0x12 * index:02X}:00.0"


def pci(bus_id: str, device_id: int = 0) -> Any:
    info = _nvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id.encode()
    info.domain, bus, dev = 0, int(bus_id[9:11], 16), int(bus_id[12:14], 16)
    info.bus, info.device, info.pciDeviceId, info.pciSubSystemId = bus, dev, device_id, 0
    return info
