"""A proven lower bound on unallocated GPU % for the pods arrived at the 100 % point.

The question: of the pods that have arrived, which subset, placed on the nodes with CPU, memory,
cards of 1000 milli and allowed models respected, allocates the most GPU? Any placement a policy
makes is one such subset, so the most GPU any subset can get bounds every policy from above, and
100 - that / capacity bounds unallocated GPU % from below.

The formulation is by patterns (configurations): a pattern of node kind *t* is a multiset of pod
kinds that fits one node of kind *t* (CPU, memory, whole cards, and shared pods packed card by
card). The master chooses how many nodes of each kind use each pattern, with at most ``N_t`` nodes
of kind *t* and at most ``n_i`` pods of kind *i*, maximising the GPU placed. Its LP relaxation is
solved by column generation, the pricing problem of each node kind being an exact MILP.

Why the figure is an upper bound on what any placement allocates, converged or not: for any pod
prices ``pi >= 0``, let ``U_t`` bound ``value(p) - pi . a(p)`` over every pattern *p* of kind *t*
(the pricing MILP's dual bound: HiGHS proves it). Then ``(max(U_t, 0), pi)`` is feasible for the
LP dual, so ``sum_t N_t max(U_t, 0) + sum_i n_i pi_i`` bounds the LP relaxation, which bounds every
integer placement (weak duality; this is Farley's bound). The smallest over the rounds is reported.
See docs/placement.md.

``keep`` asks a narrower question: the most GPU any placement allocates that still places every
kept pod (anywhere), with any of the other pods. With pods already placed as ``keep``, this bounds
what any rearrangement of them (defragmentation, however many moves) can reach. A kept kind's row
gets a lower bound ``k_i``, its price may then be negative, and the dual term of the row is
``n_i max(pi_i, 0) + k_i min(pi_i, 0)``; the argument is otherwise the same.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from random import Random

import highspy
import numpy as np

from gpuledger_core.errors import InvalidArgument
from gpuledger_sim.replay import Attempt, arrival_order
from gpuledger_sim.trace import WHOLE, TraceNode, TracePod

EPS = 1e-6
MAX_PRICING_S = 32.0  # the pricing MILP's time limit grows up to this when a round adds nothing


@dataclass(frozen=True, slots=True, order=True)
class PodKind:
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per card
    models: frozenset[str] = frozenset()

    @property
    def value(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def whole(self) -> bool:
        return self.gpu_milli >= WHOLE


@dataclass(frozen=True, slots=True, order=True)
class NodeKind:
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str

    def hosts(self, pod: PodKind) -> bool:
        """Whether a pod of this kind fits an empty node of this kind on its own."""
        return (
            pod.num_gpu <= self.gpus
            and pod.cpu_milli <= self.cpu_milli
            and pod.memory_mib <= self.memory_mib
            and (not pod.models or self.model in pod.models)
        )


@dataclass(frozen=True, slots=True)
class Bound:
    capacity: int  # GPU milli of the cluster
    arrived: int  # GPU milli asked by the pods considered
    most_allocated: float  # proven upper bound on the GPU milli any placement allocates
    lp_value: float  # the restricted master's value at the end (the bound is tight when equal)
    rounds: int
    converged: bool
    runtime_s: float

    @property
    def unallocated_pct(self) -> float:
        """The lower bound on unallocated GPU %, rounded down so it stays a bound."""
        best = min(self.most_allocated, float(self.arrived), float(self.capacity))
        return int(100_000 * (1 - int(best + EPS) / self.capacity)) / 1000


def arrived_at_100(nodes: Sequence[TraceNode], pods: Sequence[TracePod], seed: int, tune: float) -> list[TracePod]:
    """The pods arrived when GPU requests first reach 100 % of capacity, as the replay orders them."""
    capacity = sum(n.gpus for n in nodes) * WHOLE
    arrived, total = [], 0
    for pod in arrival_order(pods, Random(seed), tune, capacity):
        arrived.append(pod)
        total += pod.gpu_total
        if total >= capacity:
            break
    return arrived


def start_from(nodes: Sequence[TraceNode], attempts: Iterable[Attempt]) -> list[tuple[TraceNode, list[TracePod]]]:
    """Each node's pods in a replay's placements (feasible patterns, a good first master)."""
    by_name = {node.name: node for node in nodes}
    placed: dict[str, list[TracePod]] = {}
    for attempt in attempts:
        if attempt.node is not None:
            placed.setdefault(attempt.node, []).append(attempt.pod)
    return [(by_name[name], held) for name, held in placed.items()]


def _pod_kind(p: TracePod) -> PodKind:
    return PodKind(p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.models)


def _node_kind(n: TraceNode) -> NodeKind:
    return NodeKind(n.cpu_milli, n.memory_mib, n.gpus, n.model)


def kinds_of(nodes: Sequence[TraceNode], pods: Sequence[TracePod]) -> tuple[Counter[NodeKind], Counter[PodKind]]:
    """Node and GPU-pod kinds with their counts (pods wanting no card allocate nothing: left out)."""
    node_kinds = Counter(_node_kind(n) for n in nodes if n.gpus)
    pod_kinds = Counter(_pod_kind(p) for p in pods if p.num_gpu)
    return node_kinds, pod_kinds


def bound(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    *,
    max_rounds: int = 400,
    gap_milli: float = 1.0,
    pricing_s: float = 2.0,
    budget_s: float = 900.0,
    start: Sequence[tuple[TraceNode, Sequence[TracePod]]] = (),
    keep: Sequence[TracePod] = (),
    progress: Callable[[int, float, float], None] | None = None,
) -> Bound:
    """Column generation until the proven bound is within ``gap_milli`` of the LP, or out of rounds
    or time; the bound is valid either way. ``start``: feasible node contents as first columns.
    ``keep``: pods (among ``pods``) every placement counted must place; ``start`` must place them
    all, or the question has no feasible first answer and ``InvalidArgument`` says so."""
    started = time.perf_counter()
    node_kinds, pod_kinds = kinds_of(nodes, pods)
    kept = kinds_of((), keep)[1]
    if kept - pod_kinds:
        raise InvalidArgument("keep", "every kept pod must be one of the pods")
    capacity = sum(n.gpus for n in nodes) * WHOLE
    arrived = sum(kind.value * n for kind, n in pod_kinds.items())
    nk, pk = sorted(node_kinds), sorted(pod_kinds)
    master = Master(nk, pk, node_kinds, pod_kinds, kept)
    index = {kind: i for i, kind in enumerate(pk)}
    for node, placed in start:  # feasible node contents (a policy's placement) as first columns
        held = Counter(index[_pod_kind(p)] for p in placed if p.num_gpu)
        if held:
            master.add(nk.index(_node_kind(node)), dict(held))
    pricers = [Pricing(kind, pk, pod_kinds, pricing_s) for kind in nk]
    best, lp, rounds, converged = float(arrived), 0.0, 0, False
    while rounds < max_rounds:
        rounds += 1
        lp, prices = master.solve()
        proven = sum(pod_kinds[k] * max(p, 0.0) + kept[k] * min(p, 0.0) for k, p in zip(pk, prices, strict=True))
        added = 0
        for t, pricer in enumerate(pricers):
            upper, pattern = pricer.solve(prices)
            proven += node_kinds[nk[t]] * max(upper, 0.0)
            if pattern and pricer.reduced(pattern, prices) > master.node_price(t) + EPS:
                master.add(t, pattern)
                added += 1
        best = min(best, proven)
        if progress is not None:
            progress(rounds, lp, best)
        if best - lp <= gap_milli:
            converged = True
            break
        if time.perf_counter() - started > budget_s:
            break
        if not added:  # no better column found, but not proven: give the pricing more time
            if pricing_s >= MAX_PRICING_S:
                break
            pricing_s *= 4
            for pricer in pricers:
                pricer.h.setOptionValue("time_limit", pricing_s)
    return Bound(capacity, arrived, best, lp, rounds, converged, round(time.perf_counter() - started, 2))


def _silent() -> highspy.Highs:
    h = highspy.Highs()  # type: ignore[no-untyped-call]  # its __init__ carries no annotation
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    return h


class Master:
    """The restricted master LP: rows are node kinds (<= N_t), then pod kinds (<= n_i)."""

    def __init__(
        self,
        nk: list[NodeKind],
        pk: list[PodKind],
        node_kinds: Counter[NodeKind],
        pod_kinds: Counter[PodKind],
        kept: Counter[PodKind],
    ) -> None:
        self.h = _silent()
        self.h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        self.nodes, self.pods = len(nk), len(pk)
        self.signed = [False] * self.nodes + [kept[kind] > 0 for kind in pk]  # rows whose price keeps its sign
        inf = highspy.kHighsInf
        for count in [node_kinds[kind] for kind in nk]:
            self.h.addRow(-inf, float(count), 0, np.array([], np.int32), np.array([]))
        for kind in pk:
            low = float(kept[kind]) if kept[kind] else -inf
            self.h.addRow(low, float(pod_kinds[kind]), 0, np.array([], np.int32), np.array([]))
        self.values = [kind.value for kind in pk]
        self.duals: list[float] = [0.0] * (self.nodes + self.pods)
        for t, node in enumerate(nk):
            for i, pod in enumerate(pk):
                if node.hosts(pod):
                    self.add(t, {i: 1})

    def add(self, t: int, pattern: dict[int, int]) -> None:
        rows = [t, *(self.nodes + i for i in pattern)]
        coefs = [1.0, *(float(n) for n in pattern.values())]
        value = float(sum(self.values[i] * n for i, n in pattern.items()))
        self.h.addCol(value, 0.0, highspy.kHighsInf, len(rows), np.array(rows, np.int32), np.array(coefs))

    def solve(self) -> tuple[float, list[float]]:
        """The LP value and the pod prices: the duals of the pod rows, made non-negative where a
        row has no lower bound (a kept kind's price keeps its sign: HiGHS gives a maximisation's
        duals as the objective's gain per unit a row's bound rises)."""
        self.h.run()
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            raise InvalidArgument("keep", "no first placement places every kept pod: give one in start")
        duals = self.h.getSolution().row_dual
        self.duals = [d if signed else abs(d) for d, signed in zip(duals, self.signed, strict=True)]
        return float(self.h.getInfo().objective_function_value), self.duals[self.nodes :]

    def node_price(self, t: int) -> float:
        return self.duals[t]


class Pricing:
    """The most valuable pattern of one node kind at given pod prices, as an exact MILP.

    Columns: ``y_i`` pods of each kind the node hosts; ``e_c`` card *c* given whole; ``z_mc`` shared
    pods of per-card share *m* on card *c*. Rows: CPU, memory, whole cards, each card's 1000 milli,
    shares of each size, and symmetry (cards by load, falling; whole cards last).
    """

    def __init__(self, node: NodeKind, pk: list[PodKind], pod_kinds: Counter[PodKind], limit_s: float) -> None:
        self.kinds = [i for i, pod in enumerate(pk) if node.hosts(pod)]
        self.values = {i: pk[i].value for i in self.kinds}
        self.h = h = _silent()
        h.setOptionValue("mip_rel_gap", 1e-7)
        h.setOptionValue("time_limit", limit_s)
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        cards = node.gpus
        shares = sorted({pk[i].gpu_milli for i in self.kinds if not pk[i].whole})
        ny, ne = len(self.kinds), cards
        y = list(range(ny))
        e = [ny + c for c in range(cards)]
        z = {(m, c): ny + ne + s * cards + c for s, m in enumerate(shares) for c in range(cards)}
        lower = np.zeros(ny + ne + len(z))
        upper = np.array(
            [float(pod_kinds[pk[i]]) for i in self.kinds] + [1.0] * ne + [float(WHOLE // m) for m, _ in z]
        )
        h.addVars(len(lower), lower, upper)
        h.changeColsIntegrality(len(lower), np.arange(len(lower), dtype=np.int32), np.ones(len(lower), np.uint8))
        inf = highspy.kHighsInf
        row = self._row
        row(-inf, node.cpu_milli, {y[j]: pk[i].cpu_milli for j, i in enumerate(self.kinds)})
        row(-inf, node.memory_mib, {y[j]: pk[i].memory_mib for j, i in enumerate(self.kinds)})
        whole = {y[j]: pk[i].num_gpu for j, i in enumerate(self.kinds) if pk[i].whole}
        row(-inf, 0, {**whole, **{e[c]: -1 for c in range(cards)}})
        for c in range(cards):
            row(-inf, WHOLE, {**{z[m, c]: m for m in shares}, e[c]: WHOLE})
        for m in shares:
            sized = {y[j]: 1 for j, i in enumerate(self.kinds) if not pk[i].whole and pk[i].gpu_milli == m}
            row(-inf, 0, {**sized, **{z[m, c]: -1 for c in range(cards)}})
        for c in range(cards - 1):
            load = {z[m, c]: m for m in shares}
            for m in shares:
                load[z[m, c + 1]] = -m
            row(0, inf, load)
            row(-inf, 0, {e[c]: 1, e[c + 1]: -1})

    def _row(self, low: float, high: float, coefs: dict[int, int]) -> None:
        idx = np.array(list(coefs), np.int32)
        self.h.addRow(low, high, len(idx), idx, np.array([float(v) for v in coefs.values()]))

    def reduced(self, pattern: dict[int, int], prices: Sequence[float]) -> float:
        return sum((self.values[i] - prices[i]) * n for i, n in pattern.items())

    def solve(self, prices: Sequence[float]) -> tuple[float, dict[int, int]]:
        """A proven upper bound on the best reduced value, and the best pattern found."""
        if not self.kinds:
            return 0.0, {}
        costs = np.array([self.values[i] - prices[i] for i in self.kinds])
        self.h.changeColsCost(len(costs), np.arange(len(costs), dtype=np.int32), costs)
        self.h.run()
        info = self.h.getInfo()
        upper = float(info.mip_dual_bound)
        values = self.h.getSolution().col_value
        pattern = {i: round(values[j]) for j, i in enumerate(self.kinds) if round(values[j]) > 0}
        if not np.isfinite(upper):  # no proof (should not happen): fall back on a trivial bound
            upper = float(sum(max(c, 0.0) * u for c, u in zip(costs, self.h.getLp().col_upper_, strict=False)))
        return upper, pattern
