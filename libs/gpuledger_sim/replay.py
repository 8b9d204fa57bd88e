"""The replay protocol of the FGD paper's simulator, over gpuledger's placement code.

Arrival order is a seeded shuffle of the trace (sorted by name first); then random copies of trace
pods are appended until GPU requests would pass ``tune`` x the cluster's GPU capacity; every pod is
tried once, in that order, and nothing ever departs. Node ties go to the node first in a seeded
permutation (the simulator's scheduler takes the smallest of randomly prefixed node names).
Figures are taken when arrived GPU requests first reach 90 % and 100 % of capacity, and at the end.

Two placement paths replay the same arrival order and node order into the same figures: this
module's classic one (``NodeChooser`` over flat node states), and DRA mode C's (``dra``: each pod a
ResourceClaim allocated through the ledger). Both go through ``prepare``, ``Tally`` and ``drive``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from random import Random

from gpuledger_core.model import Request
from gpuledger_core.packing import Ask, Guard, NodeChooser, NodeState, Option, make_policy
from gpuledger_core.packing.balance import Balance
from gpuledger_core.packing.basic import tag_of
from gpuledger_core.packing.frag import FragMeter, TypicalPod, Workload, without_memory
from gpuledger_core.packing.state import charge, flat_node, take
from gpuledger_sim.defrag import Budget, Holdings, Placed
from gpuledger_sim.trace import WHOLE, TraceNode, TracePod


@dataclass(frozen=True, slots=True)
class Config:
    policy: str = "default"
    seed: int = 42
    tune: float = 1.3
    guard: Guard | None = None
    guard_auto: bool = False  # the guard in the trace's own proportions (Guard.proportional)
    defrag: Budget | None = None  # move placed pods for a pod that fits nowhere (``defrag``)


@dataclass(frozen=True, slots=True)
class Attempt:
    seq: int
    pod: TracePod
    node: str | None
    cards: tuple[int, ...] = ()


@dataclass(slots=True)
class Summary:
    policy: str
    seed: int
    tune: float
    nodes: int
    gpus: int
    path: str = "classic"  # the placement path: classic, or dra (DRA mode C's allocation)
    pods: int = 0
    placed: int = 0
    failed: int = 0
    failed_gpu_pods: int = 0
    unallocated_gpu_pct_at_100: float | None = None
    frag_total_pct_at_90: float | None = None
    frag_ratio_pct_at_90: float | None = None
    arrived_gpu_pct_final: float = 0.0
    allocated_gpu_pct_final: float = 0.0
    unallocated_gpu_pct_final: float = 0.0
    frag_total_pct_final: float = 0.0
    runtime_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def ask_of(pod: TracePod) -> Ask:
    if pod.num_gpu == 0:
        return Ask(None, pod.cpu_milli, pod.memory_mib, pod.name)
    core = None if pod.gpu_milli >= WHOLE else pod.gpu_milli
    return Ask(Request(pod.num_gpu, None, core, pod.models), pod.cpu_milli, pod.memory_mib, pod.name)


def typical_of(pod: TracePod) -> TypicalPod:
    milli = pod.gpu_milli if pod.num_gpu else 0
    return TypicalPod(pod.cpu_milli, pod.num_gpu, milli, pod.models, pod.memory_mib)


def supply_of(nodes: Sequence[TraceNode]) -> dict[str, int]:
    """The cluster's cards per model, which ``default`` weighs model-constrained demand against."""
    supply: dict[str, int] = {}
    for node in nodes:
        supply[node.model] = supply.get(node.model, 0) + node.gpus
    return supply


def arrival_order(pods: Sequence[TracePod], rng: Random, tune: float, capacity: int) -> list[TracePod]:
    """The trace shuffled, then tuned up with random copies (the simulator's own stop rule:
    it stops before a copy whose *per-card* share would pass the target)."""
    ordered = sorted(pods, key=lambda p: p.name)
    shuffled = list(ordered)
    rng.shuffle(shuffled)
    if tune <= 0 or not ordered:
        return shuffled
    target = tune * capacity
    total = sum(p.gpu_total for p in ordered)
    while total < target:
        pick = ordered[rng.randrange(len(ordered))]
        if total + pick.gpu_milli > target:
            break
        shuffled.append(replace(pick, name=f"{pick.name}-tuned-{len(shuffled) - len(ordered)}"))
        total += pick.gpu_total
    return shuffled


def tie_order(nodes: Sequence[TraceNode], rng: Random) -> list[TraceNode]:
    """The nodes in tie-break order: a seeded permutation of their names' order (the simulator
    prefixes each name with such a permutation and prefers the smallest name on equal scores)."""
    ordered = sorted(nodes, key=lambda n: n.name)
    rng.shuffle(ordered)
    return ordered


@dataclass(frozen=True, slots=True)
class Setting:
    """What every placement path replays: the pods in arrival order, the nodes in tie-break order,
    the typical pods the policies measure fragmentation against, and the seeded generator, drawn
    from in that order (a randomized policy draws on from it)."""

    order: list[TracePod]
    nodes: list[TraceNode]
    typical: list[TypicalPod]
    rng: Random
    capacity: int  # GPU, per-mille of a card


def prepare(nodes: Sequence[TraceNode], pods: Sequence[TracePod], config: Config) -> Setting:
    rng = Random(config.seed)
    capacity = sum(n.gpus for n in nodes) * WHOLE
    order = arrival_order(pods, rng, config.tune, capacity)
    return Setting(order, tie_order(nodes, rng), [typical_of(p) for p in pods], rng, capacity)


Placer = Callable[[TracePod], tuple[int, tuple[int, ...]] | None]  # position in tie-break order, cards


def drive(setting: Setting, tally: Tally, place: Placer, on_attempt: Callable[[Attempt], None] | None) -> None:
    """Every pod tried once, in arrival order; ``place`` commits it and tells ``tally`` of the node
    it changed, or says that it fits nowhere."""
    for seq, pod in enumerate(setting.order):
        found = place(pod)
        tally.attempted(pod, found is not None)
        if on_attempt is not None:
            node, cards = (None, ()) if found is None else (setting.nodes[found[0]].name, found[1])
            on_attempt(Attempt(seq, pod, node, cards))


def commit(node: NodeState, ask: Ask, cards: tuple[int, ...]) -> NodeState:
    after = charge(node, ask.cpu_milli, ask.memory_mib)
    if not cards:
        return after
    after = take(after, cards, ask.core, ask.mem, ask.exclusive, ask.isolation)
    return replace(after, tags=after.tags | {tag_of(ask)})


def guard_for(config: Config, typical: Sequence[TypicalPod]) -> Guard | None:
    if not config.guard_auto:
        return config.guard
    balance = Balance.of(Workload.of(typical))
    return Guard.proportional(balance.cpu_per_gpu, balance.mem_per_gpu)


def replay(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    config: Config,
    on_attempt: Callable[[Attempt], None] | None = None,
) -> Summary:
    started = time.perf_counter()
    setting = prepare(nodes, pods, config)
    states = [flat_node(n.name, n.model, n.gpus, n.cpu_milli, n.memory_mib) for n in setting.nodes]
    policy = make_policy(config.policy, setting.typical, supply_of(setting.nodes))
    chooser = NodeChooser(states, policy, guard_for(config, setting.typical), setting.rng)
    tally = Tally.of(config, setting, states, "classic")
    holdings = None if config.defrag is None else Holdings(setting.nodes, policy, config.defrag)
    empty = list(states)
    before_100 = 0  # pods tried before the 100 % point, defragmentation's per-pod figure

    def place(pod: TracePod) -> tuple[int, tuple[int, ...]] | None:
        nonlocal before_100
        ask = ask_of(pod)
        found = chooser.choose(ask)
        if holdings is not None and tally.summary.unallocated_gpu_pct_at_100 is None:
            before_100 += 1
            if found is None:
                found = _defragmented(holdings, pod.name, ask)
        if found is None:
            return None
        at, option = found
        chooser.update(at, commit(chooser.nodes[at], ask, option.cards))
        tally.changed(at, chooser.nodes[at])
        if holdings is not None:
            holdings.add(at, pod.name, ask, option.cards)
        return at, option.cards

    def _defragmented(holdings: Holdings, name: str, ask: Ask) -> tuple[int, Option] | None:
        """The pod's node and option once pods are moved for it (None: nothing moved, or in vain)."""
        changed = holdings.make_room(name, ask, chooser.nodes)
        for at in changed:
            chooser.update(at, rebuilt(empty[at], holdings.placed_on(at)))
            tally.changed(at, chooser.nodes[at])
        found = chooser.choose(ask) if changed else None
        holdings.tally.let_in += found is not None
        return found

    drive(setting, tally, place, on_attempt)
    if holdings is not None:
        _report(tally.summary, holdings, before_100)
    return tally.finish(time.perf_counter() - started)


def rebuilt(empty: NodeState, pods: Sequence[Placed]) -> NodeState:
    """The node's state with ``pods`` placed on it, in order, from empty."""
    node = empty
    for placed in pods:
        node = commit(node, placed.ask, placed.cards)
    return node


def _report(summary: Summary, holdings: Holdings, before_100: int) -> None:
    done = holdings.tally
    summary.extra.update(
        defrag_moves=float(done.moves),
        defrag_moves_per_1000_pods=round(1000 * done.moves / before_100, 3) if before_100 else 0.0,
        defrag_pods_searched=float(done.searched),
        defrag_pods_let_in=float(done.let_in),
        defrag_refused_by_host=float(done.refused_by_host),
        defrag_no_destination=float(done.no_destination),
        defrag_search_s=round(done.seconds, 2),
    )


class Tally:
    """Running totals and the figures taken at the milestones."""

    def __init__(self, summary: Summary, capacity: int, meter: FragMeter, states: Sequence[NodeState]):
        self.summary = summary
        self.capacity = capacity
        self.meter = meter
        self.frag = [meter.node(s) for s in states]
        self.frag_sum = sum(self.frag)
        self.idle = sum(s.gpu_room for s in states)
        self.arrived = 0
        self.allocated = 0

    @staticmethod
    def of(config: Config, setting: Setting, states: Sequence[NodeState], path: str) -> Tally:
        """The tally of a replay over ``states`` (the nodes as they start, in tie-break order)."""
        gpus = setting.capacity // WHOLE
        summary = Summary(config.policy, config.seed, config.tune, len(states), gpus, path)
        return Tally(summary, setting.capacity, FragMeter(Workload.of(without_memory(setting.typical))), states)

    def changed(self, at: int, node: NodeState) -> None:
        new = self.meter.node(node)
        self.frag_sum += new - self.frag[at]
        self.frag[at] = new

    def attempted(self, pod: TracePod, placed: bool) -> None:
        s = self.summary
        s.pods += 1
        self.arrived += pod.gpu_total
        if placed:
            s.placed += 1
            self.allocated += pod.gpu_total
        else:
            s.failed += 1
            s.failed_gpu_pods += pod.num_gpu > 0
        if s.frag_total_pct_at_90 is None and self.arrived >= 0.9 * self.capacity:
            s.frag_total_pct_at_90 = round(100 * self.frag_sum / self.capacity, 3)
            idle = self.capacity - self.allocated
            s.frag_ratio_pct_at_90 = round(100 * self.frag_sum / idle, 3) if idle else 0.0
        if s.unallocated_gpu_pct_at_100 is None and self.arrived >= self.capacity:
            s.unallocated_gpu_pct_at_100 = round(100 - 100 * self.allocated / self.capacity, 3)

    def finish(self, runtime_s: float) -> Summary:
        s = self.summary
        s.arrived_gpu_pct_final = round(100 * self.arrived / self.capacity, 3)
        s.allocated_gpu_pct_final = round(100 * self.allocated / self.capacity, 3)
        s.unallocated_gpu_pct_final = round(100 - s.allocated_gpu_pct_final, 3)
        s.frag_total_pct_final = round(100 * self.frag_sum / self.capacity, 3)
        s.runtime_s = round(runtime_s, 2)
        return s
