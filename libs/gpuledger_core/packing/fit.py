"""Whether an ask fits a node, and if not, a sentence a person understands saying why.

Two rules make the fit, each written once: the node-wide one here (``host_refusal``: staleness,
the node's free CPU and memory, the guard), which the hot path asks through ``host_fits`` and
``problem`` words; and the per-card one, ``room.refusal`` (health, model, slots, idle, memory,
compute, isolation tier), which the ledger's ``reserve`` and the allocator's fit ask too, worded by
``room.why_not``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpuledger_core.model import CORE_WHOLE
from gpuledger_core.packing.ask import Ask
from gpuledger_core.packing.state import UNTRACKED, CardState, NodeState
from gpuledger_core.room import fitting as cards_fitting
from gpuledger_core.room import refusal, why_not


class HostRefusal(Enum):
    """Why a node as a whole does not take an ask, in the order ``host_refusal`` asks."""

    STALE = "stale"
    CPU = "cpu"
    MEMORY = "memory"
    GUARD_CPU = "guard cpu"
    GUARD_MEMORY = "guard memory"


@dataclass(frozen=True, slots=True)
class Guard:
    """Dominant-resource guard: a pod that takes no card must leave the node at least
    ``cpu_per_card`` millicores and ``mem_per_card`` MiB for every card's worth of free GPU, so that
    CPU-only pods cannot strand a node's GPUs. 0 switches a dimension off.
    """

    cpu_per_card: int = 4000
    mem_per_card: int = 32 * 1024

    @staticmethod
    def proportional(cpu_per_gpu: float, mem_per_gpu: float) -> Guard:
        """The guard that keeps, per free card, what the workload's pods with cards ask per card
        (``balance.Balance``'s proportions: millicores and MiB per milli of GPU)."""
        return Guard(int(cpu_per_gpu * CORE_WHOLE), int(mem_per_gpu * CORE_WHOLE))

    def refusal(self, node: NodeState, ask: Ask) -> HostRefusal | None:
        """Which dimension the guard keeps ``ask`` from on ``node``; ``None`` when it lets it in."""
        if ask.count or not node.cards:
            return None
        cards = node.gpu_room / CORE_WHOLE
        cpu, mem = node.cpu_free, node.mem_free
        if self.cpu_per_card and cpu != UNTRACKED and cpu - ask.cpu_milli < int(cards * self.cpu_per_card):
            return HostRefusal.GUARD_CPU
        if self.mem_per_card and mem != UNTRACKED and mem - ask.memory_mib < int(cards * self.mem_per_card):
            return HostRefusal.GUARD_MEMORY
        return None

    def problem(self, node: NodeState, ask: Ask) -> str:
        """Why the guard keeps ``ask`` from ``node``; empty when it lets it in."""
        found = self.refusal(node, ask)
        return "" if found is None else self.sentence(found, node, ask)

    def sentence(self, why: HostRefusal, node: NodeState, ask: Ask) -> str:
        """``why`` (a refusal of this guard's) as a person reads it."""
        cards = node.gpu_room / CORE_WHOLE
        if why is HostRefusal.GUARD_CPU:
            what, free, taken, keep, unit = "CPU", node.cpu_free, ask.cpu_milli, self.cpu_per_card, "m"
        else:
            what, free, taken, keep, unit = "memory", node.mem_free, ask.memory_mib, self.mem_per_card, " MiB"
        kept = int(cards * keep)
        return (
            f"guard: {what} left would be {free - taken}{unit}, "
            f"below the {kept}{unit} kept for {cards:g} free card(s)"
        )


def host_refusal(node: NodeState, ask: Ask, guard: Guard | None) -> HostRefusal | None:
    """Why ``node`` as a whole does not take ``ask``; ``None`` when it does. The one host rule:
    cheap, it runs for every node a policy looks at."""
    if node.stale:
        return HostRefusal.STALE
    cpu = node.cpu_free
    if cpu != UNTRACKED and cpu < ask.cpu_milli:
        return HostRefusal.CPU
    mem = node.mem_free
    if mem != UNTRACKED and mem < ask.memory_mib:
        return HostRefusal.MEMORY
    return None if guard is None else guard.refusal(node, ask)


def host_fits(node: NodeState, ask: Ask, guard: Guard | None) -> bool:
    """The node-wide part of fit (staleness, CPU, memory, guard), without building a sentence."""
    return host_refusal(node, ask, guard) is None


def card_takes(card: CardState, ask: Ask, mix_isolation: bool = False) -> bool:
    """Whether ``card`` takes one card's worth of ``ask`` (``room.refusal``)."""
    return refusal(card, ask.want, mix_isolation) is None


def fitting(node: NodeState, ask: Ask) -> tuple[int, ...]:
    """Positions of the cards of ``node`` that could each hold one card of ``ask``."""
    return cards_fitting(node.cards, ask.want, node.mix_isolation)


def host_problem(node: NodeState, ask: Ask, guard: Guard | None = None) -> str:
    """Why ``node`` as a whole does not take ``ask`` (``host_refusal``), in words; empty when it does."""
    host = host_refusal(node, ask, guard)
    return "" if host is None else _host_sentence(host, node, ask, guard)


def problem(node: NodeState, ask: Ask, guard: Guard | None = None) -> str:
    """Why ``ask`` does not fit ``node`` now; empty when it fits."""
    host = host_refusal(node, ask, guard)
    if host is not None:
        return _host_sentence(host, node, ask, guard)
    if ask.count == 0 or len(fitting(node, ask)) >= ask.count:
        return ""
    return why_not(node.cards, ask.want, ask.count, node.mix_isolation)


def _host_sentence(why: HostRefusal, node: NodeState, ask: Ask, guard: Guard | None) -> str:
    if why is HostRefusal.STALE:
        return "node inventory is stale: nothing new is placed here until it reports again"
    if why is HostRefusal.CPU:
        return f"{node.cpu_free}m CPU free, {ask.cpu_milli - node.cpu_free}m short of {ask.cpu_milli}m"
    if why is HostRefusal.MEMORY:
        short = ask.memory_mib - node.mem_free
        return f"{node.mem_free} MiB memory free, {short} MiB short of {ask.memory_mib} MiB"
    assert guard is not None, why  # only a guard refuses for the guard
    return guard.sentence(why, node, ask)
