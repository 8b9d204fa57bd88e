"""Whether an ask fits a node, and if not, a sentence a person understands saying why.

Isolation tiers go by ``usage.tier_problem``, the rule the allocator's fit and the ledger use too.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger_core.model import CORE_WHOLE
from gpuledger_core.placement.ask import Ask
from gpuledger_core.placement.state import UNTRACKED, CardState, NodeState
from gpuledger_core.usage import tier_problem


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
    """Whether ``card`` has room for one card's worth of ``ask`` (and a free slot for it), and
    holds no tenant of another isolation tier (unless ``mix_isolation``)."""
    if not card.open or (ask.models and card.model not in ask.models):
        return False
    if ask.exclusive:
        return card.idle
    if card.core_free < ask.core or tier_problem(card.tiers, ask.isolation, mix_isolation):
        return False
    return card.mem_total == UNTRACKED or card.mem_free >= ask.mem


def fitting(node: NodeState, ask: Ask) -> tuple[int, ...]:
    """Positions of the cards of ``node`` that could each hold one card of ``ask``."""
    mix = node.mix_isolation
    return tuple(pos for pos, card in enumerate(node.cards) if card_takes(card, ask, mix))


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
    return _card_problem(node, ask)


def _host_problem(node: NodeState, ask: Ask) -> str:
    if node.cpu_free != UNTRACKED and node.cpu_free < ask.cpu_milli:
        return (
            f"{node.cpu_free}m CPU free, {ask.cpu_milli - node.cpu_free}m short of {ask.cpu_milli}m"
        )
    if node.mem_free != UNTRACKED and node.mem_free < ask.memory_mib:
        short = ask.memory_mib - node.mem_free
        return f"{node.mem_free} MiB memory free, {short} MiB short of {ask.memory_mib} MiB"
    return ""


def _card_problem(node: NodeState, ask: Ask) -> str:
    wanted = [c for c in node.cards if not ask.models or c.model in ask.models]
    if not wanted:
        models = ", ".join(sorted(node.models)) or "no cards"
        return f"no card of model {'|'.join(sorted(ask.models))} (has {models})"
    healthy = [c for c in wanted if c.healthy]
    if len(healthy) < ask.count:
        return f"{len(healthy)} healthy card(s) of the {ask.count} needed"
    if ask.exclusive:
        idle = sum(1 for c in healthy if c.idle)
        return f"{idle} free whole card(s) of the {ask.count} needed"
    slotted = [c for c in healthy if c.open]
    full = len(healthy) - len(slotted)
    if len(slotted) < ask.count:
        return (
            f"slots used up: {full} card(s) have every kubelet slot held, "
            f"{len(slotted)} card(s) with a free slot of the {ask.count} needed"
        )
    tiered = [c for c in slotted if not tier_problem(c.tiers, ask.isolation, node.mix_isolation)]
    if len(tiered) < ask.count:
        clash = next(tier_problem(c.tiers, ask.isolation, node.mix_isolation) for c in slotted if c not in tiered)
        return (
            f"{len(slotted) - len(tiered)} card(s) held by another isolation tier ({clash}), "
            f"{len(tiered)} card(s) of the {ask.count} needed"
        )
    problem = _share_problem(tiered, ask, node.mix_isolation)
    if full:  # the cards that are slot-full are part of why, though another card is named
        problem += f"; {full} other card(s) have every kubelet slot held (slots used up)"
    return problem


def _share_problem(healthy: list[CardState], ask: Ask, mix_isolation: bool) -> str:
    if ask.mem:
        tracked = [c for c in healthy if c.mem_total != UNTRACKED]
        best = max(tracked, key=lambda c: c.mem_free, default=None)
        if best is not None and best.mem_free < ask.mem:
            return (
                f"card {best.index} has {best.mem_free} MiB free, "
                f"{ask.mem - best.mem_free} MiB short of {ask.mem} MiB"
            )
    most = max(healthy, key=lambda c: c.core_free)
    if most.core_free < ask.core:
        return (
            f"card {most.index} has {most.core_free / 10:g}% compute free, "
            f"{(ask.core - most.core_free) / 10:g}% short of {ask.core / 10:g}%"
        )
    room = sum(1 for c in healthy if card_takes(c, ask, mix_isolation))
    return f"{room} card(s) with room of the {ask.count} needed"
