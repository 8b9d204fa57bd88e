"""What placement is asked to find room for: a ``Request`` of cards, plus pod CPU and memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import CORE_WHOLE, Isolation, Request
from gpuledger_core.room import Want

NO_CARD = Want(False, 0, 0)  # the want of an ask for no card (never asked of a card)


@dataclass(frozen=True, slots=True)
class Ask:
    """A pod (or tool) as placement sees it.

    ``request`` is ``None`` for a pod that wants no card. ``cpu_milli`` and ``memory_mib`` are for
    the pod as a whole (the node must have them free, as kube-scheduler checks); 0: not asked.
    ``isolation`` is the pod's tier: a shared card held by another tier does not take it.
    ``want`` is what it asks of each of its cards, as ``room.refusal`` reads it.
    """

    request: Request | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    name: str = ""
    isolation: Isolation = Isolation.NONE
    want: Want = field(default=NO_CARD, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.cpu_milli < 0:
            raise InvalidArgument("cpu", f"must not be negative, got {self.cpu_milli}m")
        if self.memory_mib < 0:
            raise InvalidArgument("memory", f"must not be negative, got {self.memory_mib} MiB")
        if self.request is not None:
            object.__setattr__(self, "want", Want.of(self.request, self.isolation))

    @property
    def count(self) -> int:
        return 0 if self.request is None else self.request.count

    @property
    def exclusive(self) -> bool:
        return self.want.exclusive

    @property
    def shared(self) -> bool:
        return self.request is not None and not self.want.exclusive

    @property
    def core(self) -> int:
        """Compute wanted on each card, per-mille (the whole card for exclusive)."""
        return self.want.core

    @property
    def mem(self) -> int:
        """Memory wanted on each card, MiB (0 for exclusive: the whole card is taken)."""
        return self.want.mem

    @property
    def models(self) -> frozenset[str]:
        return self.want.models

    def size_on(self, mem_total: int) -> int:
        """The share of one card of ``mem_total`` MiB this ask takes, per-mille (at least 1)."""
        if self.request is None:
            return 0
        if self.exclusive:
            return CORE_WHOLE
        by_mem = -(-self.mem * CORE_WHOLE // mem_total) if mem_total > 0 and self.mem else 0
        return max(1, self.core, by_mem)

    @property
    def shape(self) -> tuple[int, int, int, int, int, frozenset[str], Isolation]:
        """The key under which asks that place alike are cached (the name does not matter)."""
        return (self.count, self.core, self.mem, self.cpu_milli, self.memory_mib, self.models, self.isolation)


def gpu_ask(
    count: int,
    *,
    core_milli: int | None = None,
    mem_mib: int | None = None,
    models: frozenset[str] = frozenset(),
    cpu_milli: int = 0,
    memory_mib: int = 0,
    name: str = "",
    isolation: Isolation = Isolation.NONE,
) -> Ask:
    """Shorthand for an ``Ask`` of ``count`` cards (0: no card)."""
    request = Request(count, mem_mib, core_milli, models) if count else None
    return Ask(request, cpu_milli, memory_mib, name, isolation)
