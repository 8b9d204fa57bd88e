"""Who a pending pod may evict in the timeline replay: three strategies, compared in
``gpuledger sim --preemption`` (docs/preemption.md, "Measured on the traces").

Every strategy is asked only for a pod that wants cards and fits nowhere now, and may only name
victims of lower priority that hold cards (pods without cards are never victims, and a pod
without cards never preempts: what is measured is how cards are taken back).

- ``none``: nobody is evicted; the pod waits for departures.
- ``kube``: kube-scheduler's DefaultPreemption, which sees a node's resources as counts. Its dry
  run, per node: a node whose capacity could never take the pod is skipped (unresolvable); all
  lower-priority holders are taken off; if the node's counts (compute summed over its cards, CPU,
  memory) then take the pod, the victims are given back one by one, the most important first
  (highest priority, then the earliest started), each staying if the counts still take the pod
  without it. A node that takes the pod with nobody evicted is no candidate (its counts say it
  fits already, though its cards may not). The node is chosen as kube-scheduler's
  ``pickOneNodeForPreemption`` does: the lowest highest victim priority, the lowest sum of victim
  priorities, the fewest victims, the latest start of its earliest-started highest-priority
  victim, then the first node. Nothing in the dry run looks at which card frees what, so the
  victims may free room on several cards of which none takes the pod: they are evicted anyway,
  and the pod is then tried on that node and, failing that, wherever the policy puts it; if it
  fits nowhere it waits, its victims gone, nominated to that node: as kube-scheduler does, pods
  of its priority or below are then placed there only if the node's counts take them beside it
  (``Cluster.reserved``), and it is tried there first, until it starts or preempts elsewhere.
  The dry run, too, counts what nominated pods of the pod's priority or above hold on a node.
- ``ledger``: gpuledger's share-aware choice (``gpuledger_core.preemption.choose``) over the
  ledgers of the nodes that could take the pod if all their lower-priority holders went, by the
  node's counts and its host, with each node's free CPU and memory (``HostFree``), as the placement
  service gives it: the victims free the cards and, where the host lacks CPU or memory, further
  lower-priority holders go for it (chosen by kube-scheduler's rule, which is right for counts),
  all of them counted in the cost that ranks the nodes. The pod is started on the cards the choice
  planned.
- ``ledger+defrag``: ``ledger``, and for a pod it finds no victims for, a few running pods of the
  pod's priority or below moved to other nodes where that lets it in (``moving``), as the placement
  service does (docs/preemption.md, "Defragmentation").
- ``defrag+ledger``: moves first, of lower-priority pods only (those ``ledger`` could evict), then
  ``ledger`` where no move helps. The timeline moves the pods; these strategies only evict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuledger_core.model import Grant
from gpuledger_core.preemption import HostFree, choose
from gpuledger_sim.cluster import Cluster, Free, Job, Running
from gpuledger_sim.moving import Order


@dataclass(frozen=True, slots=True)
class Preemption:
    """Evict ``victims`` (pod names) on the node at ``at``; then start the pod on ``grants``
    (None: on the cards its fit finds there, or anywhere it fits)."""

    at: int
    victims: tuple[str, ...]
    grants: tuple[Grant, ...] | None = None


Strategy = Callable[[Cluster, Job, float], Preemption | None]


def no_preemption(cluster: Cluster, job: Job, now: float) -> Preemption | None:
    return None


def kube(cluster: Cluster, job: Job, now: float) -> Preemption | None:
    """kube-scheduler's choice by counts (see the module's note)."""
    best: tuple[tuple[int, int, int, float, int], Preemption] | None = None
    for at in range(len(cluster.nodes)):
        victims = kube_victims(cluster, at, job)
        if victims:
            key = (*_kube_cost(victims), at)
            if best is None or key < best[0]:
                best = (key, Preemption(at, tuple(v.job.name for v in victims)))
    return None if best is None else best[1]


def kube_victims(cluster: Cluster, at: int, job: Job) -> list[Running]:
    """The victims kube-scheduler's dry run picks on the node at ``at``; empty when the node is no
    candidate (it could never take the pod, takes it already, or would not with all of them gone)."""
    node, pod = cluster.nodes[at], job.pod
    if node.gpus < pod.num_gpu or node.cpu_milli < pod.cpu_milli or node.memory_mib < pod.memory_mib:
        return []
    pool = _lower_holders(cluster, at, job)
    if not pool:
        return []
    free = cluster.free(at).minus(cluster.reserved(at, job))
    if not free.plus(pool).takes(job):
        return []
    return _reprieved(free, pool, job)


def _reprieved(free: Free, pool: list[Running], job: Job) -> list[Running]:
    """``pool`` with each holder given back, the most important first, while ``free`` plus the
    rest still takes the job: kube-scheduler's reprieve of its dry run's victims."""
    victims = list(pool)
    for running in sorted(pool, key=_importance):
        trial = [v for v in victims if v is not running]
        if free.plus(trial).takes(job):
            victims = trial
    return victims


def _importance(running: Running) -> tuple[int, float, str]:
    """kube-scheduler's order of importance: the highest priority, then the earliest started."""
    return (-running.job.priority, running.started, running.job.name)


def _kube_cost(victims: Sequence[Running]) -> tuple[int, int, int, float]:
    top = max(v.job.priority for v in victims)
    earliest = min(v.started for v in victims if v.job.priority == top)
    return (top, sum(v.job.priority for v in victims), len(victims), -earliest)


def ledger(cluster: Cluster, job: Job, now: float) -> Preemption | None:
    """gpuledger's share-aware choice over the nodes worth asking (see the module's note)."""
    worth = [at for at in range(len(cluster.nodes)) if _worth_asking(cluster, at, job)]
    ledgers = [cluster.ledgers[at] for at in worth]
    hosts = {cluster.ledgers[at].node.name: HostFree(cluster.cpu_free[at], cluster.mem_free[at]) for at in worth}
    found = choose(ledgers, job.pod_ask(), job.priority, cluster.holders, cluster.fit, now, hosts)
    if found is None:
        return None
    victims = tuple(cluster.holder_of(a).job.name for a in found.evict)
    return Preemption(cluster.position[found.node], victims, found.grants)


def _worth_asking(cluster: Cluster, at: int, job: Job) -> bool:
    """Whether the node could take the pod if every lower-priority holder on it went, by its
    counts: enough cards, compute summed over them, CPU and memory."""
    if cluster.nodes[at].gpus < job.pod.num_gpu:
        return False
    return cluster.free(at).plus(_lower_holders(cluster, at, job)).takes(job)


def _lower_holders(cluster: Cluster, at: int, job: Job) -> list[Running]:
    return [r for r in cluster.on_node(at) if r.allocation is not None and r.job.priority < job.priority]


STRATEGIES: dict[str, Strategy] = {
    "none": no_preemption,
    "kube": kube,
    "ledger": ledger,
    "ledger+defrag": ledger,
    "defrag+ledger": ledger,
}
# The strategies that also move pods (``moving``): whether moves come first, and who may move.
MOVING: dict[str, Order] = {
    "ledger+defrag": Order(first=False, peers=True),
    "defrag+ledger": Order(first=True, peers=False),
}
