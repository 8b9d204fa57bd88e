"""What the timeline replay measures, per preemption strategy, and how it is printed.

Waits are the high-priority pods' (the top QoS class, pods that want cards) from creation to their
first start; percentiles by nearest rank. Unallocated GPU % is 100 - GPU held / capacity, sampled
at 21 points evenly over the trace's span (first creation to last deletion) and averaged over the
span weighted by time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

POINTS = 21  # every 5 % of the span, both ends included


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile (``fraction`` of 1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass(slots=True)
class Figures:
    strategy: str
    nodes: int
    gpus: int
    pods: int
    high_waits: list[float] = field(default_factory=list)  # s, per high-priority pod with cards started
    evictions: int = 0
    preemptions: int = 0  # pods that evicted others (once per eviction round)
    futile: int = 0  # rounds after which the preemptor still did not start
    unseen_by_kube: int = 0  # evictions in rounds where kube-scheduler's counts would evict nobody
    gpu_hours_lost: float = 0.0  # the evicted and moved pods' run time, times their GPUs
    moves: int = 0  # running pods moved to another node (defragmentation), each restarting there
    moved_for: int = 0  # pending pods started on the room moves made
    gpu_hours_lost_to_moves: float = 0.0  # of gpu_hours_lost, the moved pods' share
    never_started: int = 0  # pending at the end, never having run
    never_fits: int = 0  # of those, pods no empty node of the cluster takes
    unfinished: int = 0  # evicted and pending at the end
    high_never_started: int = 0
    samples: list[tuple[float, float]] = field(default_factory=list)  # (s, unallocated GPU %)
    unallocated_mean_pct: float = 0.0
    runtime_s: float = 0.0

    @property
    def high_started(self) -> int:
        return len(self.high_waits)

    @property
    def wait_p50(self) -> float | None:
        return percentile(self.high_waits, 0.5)

    @property
    def wait_p99(self) -> float | None:
        return percentile(self.high_waits, 0.99)

    @property
    def evictions_per_high(self) -> float:
        return self.evictions / self.high_started if self.high_started else 0.0


class Sampler:
    """Unallocated GPU % over ``[start, end]``: the samples at ``POINTS`` points and the mean."""

    def __init__(self, start: float, end: float, capacity: int):
        self.start, self.end, self.capacity = start, max(end, start), capacity
        span = self.end - self.start
        self.points = [start + span * i / (POINTS - 1) for i in range(POINTS)]
        self.samples: list[tuple[float, float]] = []
        self.last = start
        self.area = 0.0  # unallocated %, integrated over time

    def advance(self, now: float, allocated: int) -> None:
        """``allocated`` (GPU per-mille) was held from the last call until ``now``."""
        value = self._unallocated(allocated)
        while len(self.samples) < len(self.points) and self.points[len(self.samples)] < now:
            self.samples.append((self.points[len(self.samples)], value))
        lo, hi = max(self.last, self.start), min(now, self.end)
        if hi > lo:
            self.area += value * (hi - lo)
        self.last = max(self.last, now)

    def finish(self, allocated: int) -> tuple[list[tuple[float, float]], float]:
        self.advance(math.inf, allocated)
        span = self.end - self.start
        return self.samples, (self.area / span if span else self._unallocated(allocated))

    def _unallocated(self, allocated: int) -> float:
        return 100 - 100 * allocated / self.capacity if self.capacity else 0.0


def table(runs: Sequence[Figures]) -> str:
    """The markdown table of the strategies' figures, then the ratios ledger/kube when both ran."""
    head = (
        "| strategy | high-priority wait p50 (s) | p99 (s) | evictions | evictions per admitted "
        "high-priority pod | GPU-hours lost | moves | unallocated GPU % (mean) | never started | runtime (s) |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [
        f"| {f.strategy} | {_s(f.wait_p50)} | {_s(f.wait_p99)} | {f.evictions} | {f.evictions_per_high:.4f} | "
        f"{f.gpu_hours_lost:.1f} | {f.moves} | {f.unallocated_mean_pct:.2f} | {f.never_started} | {f.runtime_s:.1f} |"
        for f in runs
    ]
    return "\n".join([head, *rows, *ratios(runs)])


def rounds(runs: Sequence[Figures]) -> str:
    """The preemption rounds of each strategy: how many, how many left the preemptor waiting, and
    the evictions in rounds where kube-scheduler's counts would have evicted nobody."""
    head = (
        "| strategy | preemption rounds | rounds that left the pod waiting | evictions where kube would "
        "evict nobody | high-priority pods started | never started |\n|---|---:|---:|---:|---:|---:|"
    )
    rows = [
        f"| {f.strategy} | {f.preemptions} | {f.futile} | {f.unseen_by_kube} | {f.high_started} | "
        f"{f.never_started} ({f.never_fits} fit no node) |"
        for f in runs
    ]
    return "\n".join([head, *rows])


def ratios(runs: Sequence[Figures]) -> list[str]:
    by = {f.strategy: f for f in runs}
    if "kube" not in by or "ledger" not in by:
        return []
    kube, ours = by["kube"], by["ledger"]
    return [
        "",
        f"ledger / kube: evictions {_ratio(ours.evictions, kube.evictions)}, "
        f"wait p50 {_ratio(ours.wait_p50, kube.wait_p50)}, wait p99 {_ratio(ours.wait_p99, kube.wait_p99)}",
    ]


def over_time(runs: Sequence[Figures]) -> str:
    """Unallocated GPU % at each sample point, one column per strategy."""
    if not runs:
        return ""
    head = "| % of span | time (s) | " + " | ".join(f.strategy for f in runs) + " |"
    rule = "|---:|---:|" + "---:|" * len(runs)
    rows = []
    for i, (at, _) in enumerate(runs[0].samples):
        values = " | ".join(f"{f.samples[i][1]:.2f}" for f in runs)
        rows.append(f"| {100 * i // (POINTS - 1)} | {at:.0f} | {values} |")
    return "\n".join([head, rule, *rows])


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None:
        return "n/a"
    if theirs == 0:
        return "equal (both 0)" if ours == 0 else "n/a (kube 0)"
    return f"{ours / theirs:.3f}"
