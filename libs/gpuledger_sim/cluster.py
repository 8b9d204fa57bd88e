"""The cluster as the timeline replay holds it: each node's ledger (who holds which card), its
host's free CPU and memory, and the placement engine's view of both (``NodeChooser`` over the
nodes' states as ``from_ledger`` reads them, with the hosts' free CPU and memory).

A pod is placed as the classic replay places it: the policy chooses the node (``NodeChooser``,
host included), and the cards on that node are planned on its ledger (``pods.plan``, the fit and
card choice of every ledger write) and reserved there. Cards are shared by compute alone, as the
trace gives ``gpu_milli``: a share asks ``gpu_milli`` of a card's compute and no memory; a whole
card is held exclusively. A pod without cards takes host CPU and memory only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, AllocState, Grant, Owner, OwnerKind
from gpuledger_core.packing import Ask, NodeChooser, NodeState, Policy, from_ledger
from gpuledger_core.pods import PodAsk, plan
from gpuledger_core.preemption import Fit, Holder
from gpuledger_sim.ledgers import ledger_of
from gpuledger_sim.replay import ask_of
from gpuledger_sim.trace import WHOLE, TraceNode, TracePod

NAMESPACE = "sim"


@dataclass(frozen=True, slots=True)
class Job:
    """A trace pod as the timeline runs it: its priority, when it was created, and how long it runs
    once started (seconds)."""

    pod: TracePod
    priority: int
    created: int
    duration: int
    ask: Ask = field(init=False, compare=False, repr=False)  # what placement is asked, worked out once
    shape: object = field(init=False, compare=False, repr=False)  # the ask's shape: jobs that place alike

    def __post_init__(self) -> None:
        object.__setattr__(self, "ask", ask_of(self.pod))
        object.__setattr__(self, "shape", self.ask.shape)

    @property
    def name(self) -> str:
        return self.pod.name

    @property
    def owner(self) -> Owner:
        return Owner(OwnerKind.POD, self.pod.name, NAMESPACE, self.pod.name)

    @property
    def gpu_milli(self) -> int:
        """GPU asked in total, per-mille of a card."""
        return self.pod.gpu_total

    def pod_ask(self) -> PodAsk:
        request = self.ask.request
        containers = () if request is None else (ContainerAsk("main", request),)
        return PodAsk(self.owner, containers, cpu_milli=self.pod.cpu_milli, memory_mib=self.pod.memory_mib)


@dataclass(frozen=True, slots=True)
class Running:
    """A job started on the node at ``at``, holding ``allocation`` (None: no cards) since ``started``."""

    job: Job
    at: int
    allocation: Allocation | None
    started: float


@dataclass(frozen=True, slots=True)
class Free:
    """What a node's count of resources leaves free: compute summed over its cards, CPU, memory."""

    gpu_milli: int
    cpu_milli: int
    memory_mib: int

    def plus(self, running: Iterable[Running]) -> Free:
        held = list(running)
        return Free(
            self.gpu_milli + sum(r.job.gpu_milli for r in held),
            self.cpu_milli + sum(r.job.pod.cpu_milli for r in held),
            self.memory_mib + sum(r.job.pod.memory_mib for r in held),
        )

    def minus(self, other: Free) -> Free:
        return Free(
            self.gpu_milli - other.gpu_milli, self.cpu_milli - other.cpu_milli, self.memory_mib - other.memory_mib
        )

    def takes(self, job: Job) -> bool:
        pod = job.pod
        return self.gpu_milli >= job.gpu_milli and self.cpu_milli >= pod.cpu_milli and self.memory_mib >= pod.memory_mib


class Cluster:
    """The nodes' ledgers and hosts, who runs where, and what preemption knows of each card holder."""

    def __init__(self, nodes: Sequence[TraceNode], policy: Policy):
        self.nodes = list(nodes)
        self.ledgers = [ledger_of(n) for n in self.nodes]
        self.cpu_free = [n.cpu_milli for n in self.nodes]
        self.mem_free = [n.memory_mib for n in self.nodes]
        self.gpu_used = [0 for _ in self.nodes]
        self.fit = Fit(policy)
        self.chooser = NodeChooser([self.state(at) for at in range(len(self.nodes))], policy)
        self.empty = NodeChooser([self.state(at) for at in range(len(self.nodes))], policy)
        self.position = {n.name: at for at, n in enumerate(self.nodes)}
        self.running: dict[str, Running] = {}
        self.by_node: list[dict[str, Running]] = [{} for _ in self.nodes]
        self.holders: dict[str, Holder] = {}  # by owner key: the card holders' priorities and starts
        self.nominated: dict[str, tuple[int, Job]] = {}  # pending pods' nominated nodes, by pod name
        self.capacity = sum(n.gpus for n in self.nodes) * WHOLE
        self.allocated = 0  # GPU per-mille held

    def state(self, at: int) -> NodeState:
        return from_ledger(self.ledgers[at], cpu_free=self.cpu_free[at], mem_free=self.mem_free[at])

    def free(self, at: int) -> Free:
        return Free(self.nodes[at].gpus * WHOLE - self.gpu_used[at], self.cpu_free[at], self.mem_free[at])

    def ever_fits(self, job: Job) -> bool:
        """Whether the job fits some node of the cluster when it is empty."""
        return self.empty.choose(job.ask) is not None

    def on_node(self, at: int) -> list[Running]:
        return list(self.by_node[at].values())

    def reserved(self, at: int, job: Job) -> Free:
        """What the pods nominated to the node at ``at`` (other than ``job``) of ``job``'s priority or
        above hold there, by count: kube-scheduler counts them on their node when it fits ``job``."""
        held = [
            n
            for name, (where, n) in self.nominated.items()
            if where == at and name != job.name and n.priority >= job.priority
        ]
        return Free(0, 0, 0).plus(Running(n, at, None, 0.0) for n in held)

    def place(self, job: Job, now: float) -> Running | None:
        """The job started where the policy puts it; None when it fits nowhere now. A node whose
        counts, less what is reserved there for nominated pods, do not take the job is passed over
        (the next best node is taken)."""
        nominated = self.nominated.get(job.name)
        if nominated is not None and (running := self._start_unreserved(nominated[0], job, now)) is not None:
            return running
        barred: list[int] = []
        try:
            while (found := self.chooser.choose(job.ask)) is not None:
                running = self._start_unreserved(found[0], job, now)
                if running is not None:
                    return running
                barred.append(found[0])
                self.chooser.update(found[0], replace(self.chooser.nodes[found[0]], stale=True))
            return None
        finally:
            for at in barred:
                self.chooser.update(at, self.state(at))

    def _start_unreserved(self, at: int, job: Job, now: float) -> Running | None:
        if self.nominated and not self.free(at).minus(self.reserved(at, job)).takes(job):
            return None
        return self.start_on(at, job, now)

    def start_on(self, at: int, job: Job, now: float, grants: tuple[Grant, ...] | None = None) -> Running | None:
        """The job started on the node at ``at``, on ``grants`` or on the cards planned there now;
        None when it does not fit there."""
        pod = job.pod
        if self.cpu_free[at] < pod.cpu_milli or self.mem_free[at] < pod.memory_mib:
            return None
        allocation = None
        if pod.num_gpu:
            try:
                allocation = self._reserve(at, job, now, grants)
            except Exhausted:
                return None
        running = Running(job, at, allocation, now)
        self.nominated.pop(job.name, None)
        self._charge(at, job, 1)
        self.running[job.name] = running
        self.by_node[at][job.name] = running
        if allocation is not None:
            self.holders[job.owner.key] = Holder(job.priority, False, now, pod.cpu_milli, pod.memory_mib)
        return running

    def stop(self, name: str) -> Running:
        """The job's cards and host given back (it ended, or was evicted)."""
        running = self.running.pop(name)
        at = running.at
        del self.by_node[at][name]
        if running.allocation is not None:
            gone = running.allocation.id
            self.ledgers[at] = NodeLedger(
                self.ledgers[at].node, tuple(a for a in self.ledgers[at].allocations if a.id != gone)
            )
            del self.holders[running.job.owner.key]
        self._charge(at, running.job, -1)
        return running

    def holder_of(self, allocation: Allocation) -> Running:
        return self.running[allocation.owner.id]

    def _reserve(self, at: int, job: Job, now: float, grants: tuple[Grant, ...] | None) -> Allocation:
        ledger = self.ledgers[at]
        if grants is None:
            grants = plan(ledger, job.pod_ask(), self.fit.policy, slots_per_card=None)
        requests = () if job.ask.request is None else (job.ask.request,)  # what defragmentation re-places
        allocation = Allocation(AllocationId(f"{job.name}@{now:g}"), job.owner, ledger.node.name, grants,
                                AllocState.BOUND, created_at=now, requests=requests)  # fmt: skip
        self.ledgers[at] = reserve(ledger, allocation)
        return allocation

    def _charge(self, at: int, job: Job, sign: int) -> None:
        self.cpu_free[at] -= sign * job.pod.cpu_milli
        self.mem_free[at] -= sign * job.pod.memory_mib
        self.gpu_used[at] += sign * job.gpu_milli
        self.allocated += sign * job.gpu_milli
        self.chooser.update(at, self.state(at))
