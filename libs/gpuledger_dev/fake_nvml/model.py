"""What the fake NVML's node is made of: the chips it knows (``Arch``), its cards with their
NVLinks, MIG (``mig_state``) and processes, the events it queues and the event sets that read them;
and the cards built from a fleet node (``cards_of``), their PCI bus IDs, NVLink peers and the fleet
file's MIG layout included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml as _nvml

from gpuledger_core.mig_profiles import mig_model
from gpuledger_dev.fake_nvml.mig_state import CardMig
from gpuledger_dev.fleet_script import MigLayout, NodeScript

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


# pid, MiB (None: unknown), and inside which MIG device: (GPU instance ID, compute instance ID)
Process = tuple[int, int | None, tuple[int, int] | None]


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
    mig: CardMig | None  # None: no MIG on this card
    processes: list[Process] = field(default_factory=list)
    sm_percent: dict[int, int] = field(default_factory=dict)  # pid -> its share of the SMs' time lately
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
        mig = cards[p.card].mig
        where = None if p.mig is None or mig is None else mig.fleet[p.mig]
        cards[p.card].processes.append((p.pid, p.memory_mib, where))
    return cards


def _build_card(sim: NodeScript, i: int) -> FakeCard:
    spec = sim.node.cards[i]
    model = mig_model(spec.model, spec.memory_mib)
    mig = None if model is None else CardMig(i, spec.uuid, model)
    layout = sim.layout(i)
    if mig is not None and layout is not None:
        _partition(mig, layout)
    arch = arch_of(spec.model)
    bus = spec.pci_bus_id or default_bus_id(i)
    return FakeCard(i, spec.uuid, spec.model, spec.memory_mib, spec.numa, bus, arch, [], mig)


def _partition(mig: CardMig, layout: MigLayout) -> None:
    """The fleet file's layout, as an operator makes it: MIG on, each GPU instance with one compute
    instance of the whole of it (``nvidia-smi mig -cgi ... -C``)."""
    mig.current = mig.pending = True
    for profile, start in zip(layout.instances, layout.starts, strict=True):
        gi = mig.add_gi(profile, start)
        ci = mig.add_ci(gi, profile.slices, 0)
        mig.fleet.append(ci.where)


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
