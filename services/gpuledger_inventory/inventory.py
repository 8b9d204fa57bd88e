"""What the inventory knows about a node's cards, as plain values (no NVML types past the adapter).

``Scan`` is read at start and when the configuration changes (topology, MIG layout); ``Usage``
(memory in use, compute processes) is polled; ``GpuEvent`` comes from the health event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Card, Link


class MigMode(StrEnum):
    ENABLED = "enabled"
    DISABLED = "disabled"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class MigInstance:
    uuid: str
    gpu_instance: int
    compute_instance: int
    memory_mib: int | None = None
    slices: int | None = None
    multiprocessors: int | None = None


@dataclass(frozen=True, slots=True)
class GpuInstance:
    """A GPU instance of a card in MIG mode: its NVML ID, its profile's name (``1g.10gb``) and
    placement (start and size in memory slices)."""

    id: int
    profile: str
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class CardInfo:
    """One physical card as read at scan time (health lives in the health book, not here)."""

    card: Card
    compute_capability: tuple[int, int] | None = None
    mig_mode: MigMode = MigMode.UNKNOWN
    mig_pending: MigMode = MigMode.UNKNOWN
    mig: tuple[MigInstance, ...] = ()  # its MIG devices (compute instances)
    nvswitch_links: int = 0  # active NVLinks that end at an NVSwitch
    gpu_instances: tuple[GpuInstance, ...] | None = ()  # in MIG mode; None: they could not be read

    @property
    def uuid(self) -> CardUuid:
        return self.card.uuid


@dataclass(frozen=True, slots=True)
class Scan:
    cards: tuple[CardInfo, ...]
    links: tuple[Link, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None
    lost: tuple[int, ...] = ()  # indexes that answered GpuIsLost (not in ``cards``)
    problems: tuple[str, ...] = ()  # what could not be read, for the log and the inventory
    took_s: float = 0.0

    def by_uuid(self, uuid: str) -> CardInfo | None:
        return next((c for c in self.cards if c.uuid == uuid), None)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_mib: int | None = None  # None: the driver cannot tell
    mig_uuid: str | None = None
    pod_uid: str | None = None  # from its cgroup (cgroups.py); None: in no pod, or not read
    container_id: str | None = None
    sm_percent: int | None = None  # its mean share of the card's SM time since the last poll; None: not sampled


@dataclass(frozen=True, slots=True)
class CardUsage:
    uuid: CardUuid
    memory_used_mib: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    lost: bool = False


@dataclass(frozen=True, slots=True)
class Usage:
    cards: tuple[CardUsage, ...] = field(default=())
    attributed: bool = False  # each process's pod_uid and container_id were read (attribution.py)

    def of(self, uuid: str) -> CardUsage | None:
        return next((c for c in self.cards if c.uuid == uuid), None)


class EventKind(StrEnum):
    XID = "xid"
    ECC_DOUBLE = "ecc_double"
    ECC_SINGLE = "ecc_single"
    MIG_CHANGE = "mig_change"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """A health-relevant event; ``uuid`` is None when NVML could not say which card."""

    kind: EventKind
    uuid: CardUuid | None
    xid: int | None = None
    mig_uuid: str | None = None


def cuda_version_text(raw: int) -> str:
    """NVML's CUDA driver version integer (12060) as text ("12.6")."""
    return f"{raw // 1000}.{raw % 1000 // 10}"
