"""The trace replayed over time, with departures and preemption (``gpuledger sim --preemption``).

Unlike the FGD replay (``replay``: every pod tried once, nothing leaves), pods here arrive at
their ``creation_time`` and run for their duration in the trace (``deletion_time`` minus
``scheduled_time``; a pod the trace never ran, its whole life). A pod that starts late still runs
for its whole duration, so its end moves by its delay. A pod that cannot start waits; it is
never withdrawn.

Priorities come from the trace's QoS classes (``PRIORITIES``): LS (latency-sensitive) above
Kubernetes' own classes in their order, Guaranteed above Burstable, and BE (best effort) lowest.
The high-priority pods whose waits are reported are the LS pods that want cards.

After the events at one time (departures first, then arrivals), the pending pods are tried once
each, highest priority first, then in the order they were queued: placed where the policy puts
them (``cluster``), or, for a pod that wants cards, by evicting lower-priority holders as the
strategy chooses (``preempting``). An evicted pod is recreated by its controller: it is queued
again at once and, when it starts, starts over, its work lost (GPU-hours lost: its GPUs times the
time it had run). After a round of evictions the pending pods are tried once more, without
preemption, so that the evicted can start again where there is room. A try that failed is not
made again for a pod of the same shape (and priority) until a pod stops (more room) or, for
preemption, a lower-priority pod with cards starts (more victims).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass
from random import Random

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import Grant
from gpuledger_core.packing import make_policy
from gpuledger_sim.cluster import Cluster, Job, Running
from gpuledger_sim.moving import Mover, Moving
from gpuledger_sim.preempting import MOVING, STRATEGIES, Strategy, kube
from gpuledger_sim.replay import supply_of, typical_of
from gpuledger_sim.timeline_figures import Figures, Sampler
from gpuledger_sim.trace import WHOLE, TimedPod, TraceNode

PRIORITIES = {"LS": 3, "Guaranteed": 2, "Burstable": 1, "BE": 0}
HIGH = max(PRIORITIES.values())
DEPARTURE, ARRIVAL = 0, 1  # at one time, departures first


def job_of(timed: TimedPod) -> Job:
    priority = PRIORITIES.get(timed.qos)
    if priority is None:
        known = ", ".join(PRIORITIES)
        raise InvalidArgument("qos", f"pod {timed.pod.name} has QoS class {timed.qos!r}; known: {known}")
    return Job(timed.pod, priority, timed.created, timed.duration)


def subset(nodes: Sequence[TraceNode], gpus: int, seed: int) -> list[TraceNode]:
    """A seeded sample of the nodes with cards, in name order, of at least ``gpus`` cards in all:
    the nodes shuffled by ``seed``, taken until they hold that many."""
    shuffled = sorted((n for n in nodes if n.gpus), key=lambda n: n.name)
    Random(seed).shuffle(shuffled)
    taken: list[TraceNode] = []
    for node in shuffled:
        if sum(n.gpus for n in taken) >= gpus:
            break
        taken.append(node)
    return sorted(taken, key=lambda n: n.name)


@dataclass(slots=True)
class _Entry:
    job: Job
    queued: float
    seq: int

    @property
    def order(self) -> tuple[int, float, int]:
        return (-self.job.priority, self.queued, self.seq)


class Timeline:
    """One replay of the jobs over the cluster under one strategy."""

    def __init__(self, cluster: Cluster, jobs: Sequence[Job], strategy: str, moving: Moving | None = None):
        self.cluster, self.strategy = cluster, strategy
        self.choose: Strategy = STRATEGIES[strategy]
        self.preempts = strategy != "none"
        order = MOVING.get(strategy)
        self.mover = None if order is None else Mover(cluster, moving or Moving(), order)
        gpus = cluster.capacity // WHOLE
        self.figures = Figures(strategy, len(cluster.nodes), gpus, len(jobs))
        start = min((j.created for j in jobs), default=0)
        end = max((j.created + j.duration for j in jobs), default=0)
        self.sampler = Sampler(start, end, cluster.capacity)
        self.events: list[tuple[float, int, int, str, float]] = []  # time, kind, seq, pod, its start
        self.jobs = {j.name: j for j in jobs}
        self.pending: dict[str, _Entry] = {}
        self.ran: set[str] = set()
        self.seq = 0
        self.stops = 0
        self.starts = dict.fromkeys(PRIORITIES.values(), 0)  # card holders started, by priority
        # Tries that failed, by the jobs' shape (and priority), with the counts they failed at: the
        # same try fails again until a pod stops (more room) or a lower-priority holder starts
        # (more victims).
        self.placed_in_vain: dict[object, int] = {}
        self.preempted_in_vain: dict[tuple[object, int], tuple[int, int]] = {}
        self.moved_in_vain: dict[tuple[object, int], tuple[int, int]] = {}
        for job in jobs:
            self._push(job.created, ARRIVAL, job.name, 0.0)

    def run(self) -> Figures:
        while self.events:
            now = self.events[0][0]
            self.sampler.advance(now, self.cluster.allocated)
            while self.events and self.events[0][0] == now:
                _, kind, _, name, started = heapq.heappop(self.events)
                if kind == ARRIVAL:
                    self._queue(self.jobs[name], now)
                else:
                    self._depart(name, started)
            if self._try_pending(now, preempt=True):
                self._try_pending(now, preempt=False)
        return self._finish()

    def _push(self, at: float, kind: int, name: str, started: float) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, kind, self.seq, name, started))

    def _queue(self, job: Job, now: float) -> None:
        self.seq += 1
        self.pending[job.name] = _Entry(job, now, self.seq)

    def _depart(self, name: str, started: float) -> None:
        running = self.cluster.running.get(name)
        if running is not None and running.started == started:  # not a run since evicted
            self.cluster.stop(name)
            self.stops += 1

    def _try_pending(self, now: float, *, preempt: bool) -> bool:
        """Every pending pod tried once; whether any pod was evicted."""
        evicted = False
        for entry in sorted(self.pending.values(), key=lambda e: e.order):
            if self._place(entry, now):
                continue
            if not (preempt and self.preempts and entry.job.pod.num_gpu):
                continue
            first = self.mover is not None and self.mover.order.first
            if (
                (first and self._move(entry, now))
                or self._preempt(entry, now)
                or (not first and self._move(entry, now))
            ):
                evicted = True  # the room the evicted or moved pods left may take others
        return evicted

    def _place(self, entry: _Entry, now: float) -> bool:
        shape = entry.job.shape
        if self.placed_in_vain.get(shape) == self.stops:
            return False
        running = self.cluster.place(entry.job, now)
        if running is None:
            self.placed_in_vain[shape] = self.stops
            return False
        self._started(running)
        return True

    def _preempt(self, entry: _Entry, now: float) -> bool:
        """Whether the strategy evicted anyone for the pod (which then starts, if it fits)."""
        job = entry.job
        key = (job.shape, job.priority)
        counts = (self.stops, sum(n for p, n in self.starts.items() if p < job.priority))
        if self.preempted_in_vain.get(key) == counts:
            return False
        found = self.choose(self.cluster, job, now)
        if found is None or not found.victims:
            self.preempted_in_vain[key] = counts
            return False
        self.figures.preemptions += 1
        if self.strategy != "kube" and kube(self.cluster, job, now) is None:
            self.figures.unseen_by_kube += len(found.victims)
        for name in found.victims:
            self._evict(name, now)
        running = self.cluster.start_on(found.at, job, now, found.grants)
        if running is None and found.grants is None:
            running = self.cluster.place(job, now)
        if running is None:
            self.figures.futile += 1
            if found.grants is None:
                self.cluster.nominated[job.name] = (found.at, job)
        else:
            self._started(running)
        return True

    def _move(self, entry: _Entry, now: float) -> bool:
        """Whether running pods were moved so that the pod starts (``moving``): each restarts at once
        where ``repack`` put it, its work lost. A try that found nothing is not made again for a pod
        of the same shape and priority until a pod stops or one that could move starts
        (the cool-downs and the hour's budget that lapse meanwhile wait for that)."""
        if self.mover is None:
            return False
        job = entry.job
        key = (job.shape, job.priority)
        order = self.mover.order
        counts = (self.stops, sum(n for p, n in self.starts.items() if order.may_move(p, job.priority)))
        if self.moved_in_vain.get(key) == counts:
            return False
        found = self.mover.plan(job, now)
        if found is None:
            self.moved_in_vain[key] = counts
            return False
        for move in found.moves:
            self._relocate(move.allocation.owner.id, self.cluster.position[move.to], move.grants, now)
        running = self.cluster.start_on(self.cluster.position[found.node], job, now, found.grants)
        assert running is not None, "repack's room and the host check let the pod in"
        self.figures.moved_for += 1
        self._started(running)
        return True

    def _relocate(self, name: str, to: int, grants: tuple[Grant, ...], now: float) -> None:
        assert self.mover is not None
        old = self.cluster.stop(name)
        self.stops += 1
        lost = old.job.gpu_milli / WHOLE * (now - old.started) / 3600
        self.figures.moves += 1
        self.figures.gpu_hours_lost += lost
        self.figures.gpu_hours_lost_to_moves += lost
        self.mover.moved(name, now)
        running = self.cluster.start_on(to, old.job, now, grants)
        assert running is not None, "repack's destination and the host check take the moved pod"
        self.starts[old.job.priority] += 1
        self._push(running.started + old.job.duration, DEPARTURE, name, running.started)

    def _evict(self, name: str, now: float) -> None:
        running = self.cluster.stop(name)
        self.stops += 1
        self.figures.evictions += 1
        self.figures.gpu_hours_lost += running.job.gpu_milli / WHOLE * (now - running.started) / 3600
        self._queue(running.job, now)

    def _started(self, running: Running) -> None:
        job = running.job
        del self.pending[job.name]
        if job.pod.num_gpu:
            self.starts[job.priority] += 1
        if job.name not in self.ran:
            self.ran.add(job.name)
            if job.priority == HIGH and job.pod.num_gpu:
                self.figures.high_waits.append(running.started - job.created)
        self._push(running.started + job.duration, DEPARTURE, job.name, running.started)

    def _finish(self) -> Figures:
        f = self.figures
        f.samples, f.unallocated_mean_pct = self.sampler.finish(self.cluster.allocated)
        waiting = [e.job for e in self.pending.values()]
        f.unfinished = sum(1 for j in waiting if j.name in self.ran)
        never = [j for j in waiting if j.name not in self.ran]
        f.never_started = len(never)
        f.never_fits = sum(1 for j in never if not self.cluster.ever_fits(j))
        f.high_never_started = sum(1 for j in never if j.priority == HIGH and j.pod.num_gpu)
        return f


def run_timeline(
    nodes: Sequence[TraceNode],
    pods: Sequence[TimedPod],
    strategy: str,
    policy: str = "default",
    moving: Moving | None = None,
) -> Figures:
    """The pods replayed over time on ``nodes`` under ``strategy`` (``none``, ``kube``, ``ledger``,
    ``ledger+defrag`` with the ``moving`` budget, default ``Moving()``)."""
    if strategy not in STRATEGIES:
        raise InvalidArgument("--preemption", f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    started = time.perf_counter()
    jobs = [job_of(p) for p in pods]
    cluster = Cluster(nodes, make_policy(policy, [typical_of(p.pod) for p in pods], supply_of(nodes)))
    figures = Timeline(cluster, jobs, strategy, moving).run()
    figures.runtime_s = round(time.perf_counter() - started, 2)
    return figures
