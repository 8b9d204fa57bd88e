"""Defragmentation in the timeline replay (strategies ``ledger+defrag`` and ``defrag+ledger``,
docs/defragmentation.md): for a pending pod that wants cards and fits nowhere, a few running pods are
moved to other nodes so that it fits on one (``gpuledger_core.repack``). A moved pod starts over on
the node ``repack`` found for it, at once: its work so far is lost, as an evicted pod's is, but it
does not wait. Two orders (``Order``):

- ``ledger+defrag``, the placement service's (docs/preemption.md, "Defragmentation"): preemption
  first; moves only for a pod it finds no victims for, and pods of the pod's priority or below may
  move (peers too: such a pod has nobody below it to evict);
- ``defrag+ledger``: moves first, then preemption where they do not help; only pods of lower
  priority may move (those the pod could evict: a move stands in for an eviction, and the moved
  pod does not wait).

Either way:

- only pods that hold cards move, never one moved within ``Moving.cooldown_s``;
- at most ``Moving.per_pod`` moves for one pod, and at most ``Moving.per_hour`` in any hour of the
  replay (a sliding window: the moves made less than 3,600 s before count).

The nodes that may be cleared are those whose counts (compute summed over the cards, CPU, memory)
would take the pod if every movable pod there left, and where one of those pods would fit the card
with the most room on another node (else none of them could move). A moved pod goes where
``repack`` puts it, on a node whose host has its CPU and memory free (all the pods moved to one
node together); the cleared node's host must have the pending pod's once they are gone. Anything
short of that: no move.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import NodeName
from gpuledger_core.model import Allocation
from gpuledger_core.preemption import Holder
from gpuledger_core.repack import Repack, repack
from gpuledger_sim.cluster import Cluster, Free, Job, Running
from gpuledger_sim.trace import WHOLE

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class Order:
    """Whether moves come before preemption, and whether pods of the pending pod's own priority may
    move (else lower priority only)."""

    first: bool
    peers: bool

    def may_move(self, priority: int, of: int) -> bool:
        """Whether a pod of ``priority`` may move for a pending pod of priority ``of``."""
        return priority < of or (self.peers and priority == of)


@dataclass(frozen=True, slots=True)
class Moving:
    """The budget of moves: per pending pod, per hour of the replay, and the cool-down (s) before a
    moved pod may move again."""

    per_pod: int = 2  # the placement service's defaults (defrag_max_moves, _moves_per_hour, _cooldown_s)
    per_hour: int = 10
    cooldown_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.per_pod < 1:
            raise InvalidArgument("--moves-per-pod", f"must be 1 or more, got {self.per_pod}")
        if self.per_hour < 1:
            raise InvalidArgument("--moves-per-hour", f"must be 1 or more, got {self.per_hour}")
        if self.cooldown_s < 0:
            raise InvalidArgument("--move-cooldown", f"must be 0 or more seconds, got {self.cooldown_s:g}")


class Mover:
    """Chooses the moves for a pending pod within the budget, and remembers who moved when."""

    def __init__(self, cluster: Cluster, moving: Moving, order: Order):
        self.cluster, self.moving, self.order = cluster, moving, order
        self.recent: deque[float] = deque()  # when the moves of the last hour were made
        self.moved_at: dict[str, float] = {}  # by pod name: its last move

    def plan(self, job: Job, now: float) -> Repack | None:
        """The moves that let ``job`` start (see the module's note); None: none within the budget."""
        while self.recent and self.recent[0] <= now - HOUR_S:
            self.recent.popleft()
        left = min(self.moving.per_pod, self.moving.per_hour - len(self.recent))
        if left <= 0:
            return None
        movable = self._movable(job, now)
        rooms = [max((card.room for card in state.cards), default=0) for state in self.cluster.chooser.nodes]
        targets = [at for at in range(len(rooms)) if self._could_clear(at, job, movable, rooms)]
        if not targets:
            return None
        c = self.cluster
        held = {r.job.owner.key: Holder(0, started_at=r.started) for r in movable.values()}
        found = repack(c.ledgers, job.pod_ask(), held, c.fit, now, left, self._host,
                       {c.ledgers[at].node.name for at in targets})  # fmt: skip
        if found is None or not self._hosts_take(found, job):
            return None
        return found

    def moved(self, name: str, now: float) -> None:
        self.recent.append(now)
        self.moved_at[name] = now

    def _movable(self, job: Job, now: float) -> dict[str, Running]:
        cooled = now - self.moving.cooldown_s
        return {
            name: r
            for name, r in self.cluster.running.items()
            if r.allocation is not None
            and self.order.may_move(r.job.priority, job.priority)
            and (name not in self.moved_at or self.moved_at[name] <= cooled)
        }

    def _could_clear(self, at: int, job: Job, movable: dict[str, Running], rooms: list[int]) -> bool:
        """Whether the node's counts would take the pod without its movable pods, and one of those
        would fit the card with the most room on another node (a quick test before ``repack``)."""
        if self.cluster.nodes[at].gpus < job.pod.num_gpu:
            return False
        here = [r for r in self.cluster.on_node(at) if r.job.name in movable]
        if not here or not self.cluster.free(at).plus(here).takes(job):
            return False
        elsewhere = max((room for other, room in enumerate(rooms) if other != at), default=0)
        return any((WHOLE if r.job.ask.exclusive else r.job.ask.core) <= elsewhere for r in here)

    def _host(self, allocation: Allocation, node: NodeName) -> bool:
        pod = self.cluster.holder_of(allocation).job.pod
        at = self.cluster.position[node]
        return self.cluster.cpu_free[at] >= pod.cpu_milli and self.cluster.mem_free[at] >= pod.memory_mib

    def _hosts_take(self, found: Repack, job: Job) -> bool:
        """Whether each destination's host takes all the pods moved there, and the cleared node's
        host the pod once they are gone."""
        c = self.cluster
        going = [c.holder_of(m.allocation) for m in found.moves]
        cleared = c.free(c.position[found.node]).plus(going)
        if cleared.cpu_milli < job.pod.cpu_milli or cleared.memory_mib < job.pod.memory_mib:
            return False
        for to in {m.to for m in found.moves}:
            there = [c.holder_of(m.allocation) for m in found.moves if m.to == to]
            need = Free(0, 0, 0).plus(there)
            at = c.position[to]
            if c.cpu_free[at] < need.cpu_milli or c.mem_free[at] < need.memory_mib:
                return False
        return True
