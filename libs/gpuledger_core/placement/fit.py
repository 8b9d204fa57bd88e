"""Whether an ask fits a node, and if not, a sentence a person understands saying why.

Whether a card takes one card's worth of the ask is the one per-card rule, ``room.refusal``
(health, model, slots, idle, memory, compute, isolation tier), which the ledger's ``reserve`` and
the allocator's fit ask too; ``room.why_not`` words it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger_core.model import CORE_WHOLE
from gpuledger_core.placement.ask import Ask
from gpuledger_core.placement.state import UNTRACKED, CardState, NodeState
from gpuledger_core.room import fitting as cards_fitting
from gpuledger_core.room import refusal, why_not


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

    def problem(self, node: NodeState, ask: Ask) -> str:
        if ask.count or not node.cards:
            return ""
        cards = node.gpu_room / CORE_WHOLE
        for what, free, need_each, unit in (
            ("CPU", node.cpu_free, self.cpu_per_card, "m"),
            ("memory", node.mem_free, self.mem_per_card, " MiB"),
        ):
            taken = ask.cpu_milli if what == "CPU" else ask.memory_mib
            keep = int(cards * need_each)
            if need_each and free != UNTRACKED and free - taken < keep:
                return (
                    f"guard: {what} left would be {free - taken}{unit}, "
                    f"below the {keep}{unit} kept for {cards:g} free card(s)"
                )
        return ""


def card_takes(card: CardState, ask: Ask, mix_isolation: bool = False) -> bool:
    """Whether ``card`` takes one card's worth of ``ask`` (``room.refusal``)."""
    return refusal(card, ask.want, mix_isolation) is None


def fitting(node: NodeState, ask: Ask) -> tuple[int, ...]:
    """Positions of the cards of ``node`` that could each hold one card of ``ask``."""
    return cards_fitting(node.cards, ask.want, node.mix_isolation)


def problem(node: NodeState, ask: Ask, guard: Guard | None = None) -> str:
    """Why ``ask`` does not fit ``node`` now; empty when it fits."""
    if node.stale:
        return "node inventory is stale: nothing new is placed here until it reports again"
    host = _host_problem(node, ask)
    if host:
        return host
    if ask.count == 0:
        return guard.problem(node, ask) if guard else ""
    if len(fitting(node, ask)) >= ask.count:
        return ""
    return why_not(node.cards, ask.want, ask.count, node.mix_isolation)


def _host_problem(node: NodeState, ask: Ask) -> str:
    if node.cpu_free != UNTRACKED and node.cpu_free < ask.cpu_milli:
        return (
            f"{node.cpu_free}m CPU free, {ask.cpu_milli - node.cpu_free}m short of {ask.cpu_milli}m"
        )
    if node.mem_free != UNTRACKED and node.mem_free < ask.memory_mib:
        short = ask.memory_mib - node.mem_free
        return f"{node.mem_free} MiB memory free, {short} MiB short of {ask.memory_mib} MiB"
    return ""
