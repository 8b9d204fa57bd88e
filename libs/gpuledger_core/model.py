"""Domain values: nodes, cards, links, requests and allocations.

Compute is counted in per-mille of a card (``CORE_WHOLE`` = 1000 is the whole card), so that the
API's percent (x10) and the trace's ``gpu_milli`` both map onto it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import AllocationId, CardUuid, NodeName

CORE_WHOLE = 1000
MAX_CARDS_PER_REQUEST = 64
MIG_SMALLEST = "smallest"  # Request.mig: the smallest profile of the card's model that holds mem and core


class PcieLevel(IntEnum):
    """How two cards reach each other over PCIe, best first (NVML topology levels)."""

    SAME_BOARD = 0
    SINGLE_SWITCH = 10
    MULTI_SWITCH = 20
    HOST_BRIDGE = 30
    NUMA_NODE = 40
    SYSTEM = 50


class Health(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class Remedy(StrEnum):
    """Where a card stands in its repair (docs/remediation.md); its health is unhealthy while set."""

    NONE = ""  # serving (or merely unhealthy: no new work, its holders stay)
    DRAIN = "drain"  # its holders must move off (placement evicts them)
    RESET = "reset"  # empty, being reset or checked: takes nothing
    RETIRED = "retired"  # out of service until an operator acts


class CardMode(StrEnum):
    """How a card is shared: whole or by memory shares (the default), or split into MIG instances
    (docs/mig.md). A card is in one mode at a time; the mode changes only while the card is empty."""

    WHOLE = "whole"  # one holder takes it whole, or several hold shares of it
    MIG = "mig"  # a set of MIG placements, each instance held whole by one holder


class AllocState(StrEnum):
    RESERVED = "reserved"
    BOUND = "bound"
    RELEASED = "released"


class Isolation(StrEnum):
    NONE = "none"
    MPS = "mps"


class OwnerKind(StrEnum):
    POD = "pod"
    TOOL = "tool"
    CLAIM = "claim"  # a DRA ResourceClaim, by uid (placement's claims controller holds its cards)


@dataclass(frozen=True, slots=True)
class Link:
    """The connection between the cards with indexes ``a`` < ``b`` on one node."""

    a: int
    b: int
    nvlinks: int = 0
    pcie: PcieLevel = PcieLevel.SYSTEM


@dataclass(frozen=True, slots=True)
class MigSlot:
    """A MIG placement: a GPU instance of ``profile`` (its name, ``1g.10gb``) over the memory slices
    ``[start, start + size)`` of its card (``gpuledger_core.mig_profiles``)."""

    profile: str
    start: int
    size: int

    def overlaps(self, other: MigSlot) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A GPU instance that exists on a card in MIG mode, as the node's inventory reports it:
    ``static`` when an operator made it (gpuledger uses it, never destroys it), else made by
    gpuledger on demand; ``uuid`` is its MIG device's (``MIG-...``), once it has one. ``fault`` says
    why the instance is unhealthy (an XID inside it): empty while it is healthy. A faulted instance
    takes no new holder; the card and its other instances are unaffected. ``remedy`` is
    ``Remedy.DRAIN`` when its fault also needs its holder moved off (placement evicts it)."""

    slot: MigSlot
    static: bool = True
    uuid: str = ""
    fault: str = ""
    remedy: Remedy = Remedy.NONE


@dataclass(frozen=True, slots=True)
class Card:
    uuid: CardUuid
    index: int
    model: str
    memory_mib: int
    numa: int | None = None
    health: Health = Health.HEALTHY
    minor: int | None = None
    pci_bus_id: str = ""
    health_reason: str = ""  # why the card is unhealthy (empty when healthy)
    remedy: Remedy = Remedy.NONE  # its repair, decided by the node's inventory
    mode: CardMode = CardMode.WHOLE
    instances: tuple[MigInstance, ...] = ()  # in MIG mode: the GPU instances that exist

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY

    @property
    def mig(self) -> bool:
        return self.mode is CardMode.MIG


@dataclass(frozen=True, slots=True)
class Node:
    name: NodeName
    cards: tuple[Card, ...]
    links: tuple[Link, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: tuple[tuple[str, str], ...] = ()

    def card(self, uuid: CardUuid) -> Card | None:
        return next((c for c in self.cards if c.uuid == uuid), None)

    def link(self, a: int, b: int) -> Link:
        lo, hi = min(a, b), max(a, b)
        found = next((ln for ln in self.links if ln.a == lo and ln.b == hi), None)
        return found or Link(lo, hi)


@dataclass(frozen=True, slots=True)
class Request:
    """What one container (or tool) asks for: ``count`` cards, each with the same share.

    With neither ``mem_mib`` nor ``core_milli`` the cards are exclusive.
    """

    count: int = 1
    mem_mib: int | None = None
    core_milli: int | None = None
    models: frozenset[str] = frozenset()
    mig: str = ""  # a MIG instance on each card: a profile's name, or MIG_SMALLEST (docs/mig.md)

    def __post_init__(self) -> None:
        if self.mig:
            self._check_mig()
        if not 1 <= self.count <= MAX_CARDS_PER_REQUEST:
            raise InvalidArgument("gpu", f"must be 1..{MAX_CARDS_PER_REQUEST} cards, got {self.count}")
        if self.mem_mib is not None and self.mem_mib <= 0:
            raise InvalidArgument("gpu-mem", f"must be a positive number of MiB, got {self.mem_mib}")
        if self.core_milli is not None and not 1 <= self.core_milli <= CORE_WHOLE:
            raise InvalidArgument("gpu-core", f"must be 1..100 percent, got {self.core_milli / 10:g}")

    def _check_mig(self) -> None:
        sized = self.mem_mib is not None or self.core_milli is not None
        if self.mig == MIG_SMALLEST and not sized:
            raise InvalidArgument("mig", "the smallest profile that fits needs gpu-mem or gpu-core to fit")
        if self.mig != MIG_SMALLEST and sized:
            raise InvalidArgument("mig", f"profile {self.mig} names its memory and compute: no gpu-mem or gpu-core")

    @property
    def exclusive(self) -> bool:
        return self.mem_mib is None and self.core_milli is None and not self.mig

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds an allocation: a pod (by uid), a DRA ResourceClaim (by uid) or an outside tool
    (by its own id)."""

    kind: OwnerKind
    id: str
    namespace: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            raise InvalidArgument("id", "must not be empty")

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.id}"

    def describe(self) -> str:
        if self.kind is OwnerKind.POD and self.name:
            return f"pod {self.namespace}/{self.name}"
        if self.kind is OwnerKind.CLAIM and self.name:
            return f"claim {self.namespace}/{self.name}"
        return f"{self.kind} {self.id}"


@dataclass(frozen=True, slots=True)
class CardShare:
    """What one allocation holds of one card."""

    uuid: CardUuid
    index: int
    mem_mib: int
    core_milli: int
    exclusive: bool = False
    mig: MigSlot | None = None  # the MIG placement held whole (mem and core: the profile's)


@dataclass(frozen=True, slots=True)
class Grant:
    """The cards of one container of the owner (``container`` is empty for a tool).

    ``device_ids`` are the kubelet device IDs (``<card uuid>::<slot>``, one per card, see
    ``gpuledger_core.slots``) reserved for this container: they are how the node's plugin knows
    which container kubelet is admitting. Empty for tools.
    """

    container: str
    cards: tuple[CardShare, ...]
    init: bool = False
    device_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Drain:
    """A tool's allocation on a card whose holders must move off (docs/remediation.md, "Tools on a
    draining card"): its owner was told at ``since``; the allocator releases it at ``release_at``."""

    card: CardUuid
    card_index: int
    since: float
    release_at: float
    reason: str  # names the card and its fault


@dataclass(frozen=True, slots=True)
class Allocation:
    id: AllocationId
    owner: Owner
    node: NodeName
    grants: tuple[Grant, ...]
    state: AllocState = AllocState.RESERVED
    isolation: Isolation = Isolation.NONE
    created_at: float = 0.0
    updated_at: float = 0.0
    lease_expires_at: float | None = None
    requests: tuple[Request, ...] = field(default=())
    reason: str = ""
    drain: Drain | None = None  # being drained off a failing card (tools only)

    @property
    def live(self) -> bool:
        return self.state is not AllocState.RELEASED

    def lapsed_at(self, now: float) -> bool:
        """A reservation whose lease has run out (the next write to its node releases it)."""
        lease = self.lease_expires_at
        return self.state is AllocState.RESERVED and lease is not None and lease <= now

    def held_at(self, now: float) -> bool:
        """Live, and not a reservation whose lease has run out."""
        return self.live and not self.lapsed_at(now)

    def shares(self) -> tuple[CardShare, ...]:
        return tuple(share for grant in self.grants for share in grant.cards)
