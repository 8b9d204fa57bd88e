"""Pods that filter has placed on a node but whose reservation the ledger does not hold yet.

kube-scheduler runs its scheduling cycle one pod at a time and binds asynchronously, so the next
pod is filtered before the previous one's bind has written its reservation. Filter chooses one
node for a pod that wants cards and records an *assumption* here: the pod, the node, and the
allocation it would take there (cards, shares, device IDs), which every later filter, prioritize
and place counts against that node. An assumption ends when

- the pod's allocation appears in the ledger view (``written``: matched by owner),
- the bind for the pod finishes, either way (``bound``, ``failed``),
- the same pod is filtered again (``refiltered``: its new choice replaces it), or
- ``ttl_s`` passes without any of these (``expired``: a pod the scheduler never bound).

Each assumption keeps who made it: the identity of the filter's caller (its client certificate's
common name; '' for a caller that presented none, over plain HTTP). Its copy of the pod is that
caller's word, so only a bind from the same identified caller may take it instead of reading the
pod (``taken_by``): one caller's filter body cannot steer another caller's bind.

Nothing here does I/O. ``entry`` gives the service a node's view entry with its assumed pods
counted: a derived entry with its own memo of answers, rebuilt whenever the view's entry or the
node's assumptions change (each change bumps the node's ``generation``), so no answer computed
with other assumptions is ever served.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Owner
from gpuledger_core.packing import from_ledger
from gpuledger_core.packing.state import UNTRACKED
from gpuledger_core.pods import PodAsk
from gpuledger_placement.metrics import ASSUMED, ASSUMPTIONS
from gpuledger_placement.view import NodeEntry

log = logging.getLogger(__name__)
DEFAULT_TTL_S = 30.0


@dataclass(frozen=True, slots=True)
class Assumption:
    allocation: Allocation  # what the pod would hold on ``allocation.node``; never written
    pod: PodAsk  # what it was planned for, as filter read it from the caller's copy of the pod
    at: float  # when filter chose (monotonic)
    caller: str = ""  # the filter's caller (its client certificate's common name; '': unidentified)

    def taken_by(self, caller: str) -> bool:
        """Whether a bind from ``caller`` may take this assumption's copy of the pod: only an
        identified caller, the same one whose filter sent that copy."""
        return bool(self.caller) and self.caller == caller

    @property
    def containers(self) -> tuple[ContainerAsk, ...]:
        return self.pod.containers

    @property
    def node(self) -> str:
        return self.allocation.node

    @property
    def owner(self) -> Owner:
        return self.allocation.owner


@dataclass(frozen=True, slots=True)
class Counted:
    """A node's view entry with the pods assumed on it counted."""

    base: NodeEntry  # the view's entry it was made from
    generation: int  # of the node's assumptions it counts
    entry: NodeEntry


@dataclass(slots=True)
class Assumptions:
    ttl_s: float = DEFAULT_TTL_S
    clock: Callable[[], float] = time.monotonic
    _by_owner: dict[str, Assumption] = field(default_factory=dict)  # in the order made: oldest first
    _by_node: dict[str, dict[str, Assumption]] = field(default_factory=dict)
    _generations: dict[str, int] = field(default_factory=dict)
    _counted: dict[str, Counted] = field(default_factory=dict)

    def assume(self, allocation: Allocation, pod: PodAsk, caller: str = "") -> Assumption:
        """Record that ``allocation``'s owner is placed on its node, by the filter of ``caller``;
        replaces the owner's earlier one."""
        replaced = self.forget(allocation.owner, "refiltered")
        made = Assumption(allocation, pod, self.clock(), caller)
        self._by_owner[allocation.owner.key] = made
        self._by_node.setdefault(made.node, {})[allocation.owner.key] = made
        self._bump(made.node)
        ASSUMPTIONS.labels("made").inc()
        ASSUMED.inc()
        if replaced is not None and replaced.node != made.node:
            log.debug("%s now assumed on %s, not %s", allocation.owner.describe(), made.node, replaced.node)
        return made

    def forget(self, owner: Owner, why: str) -> Assumption | None:
        """End the owner's assumption, if it has one, counting ``why``."""
        gone = self._by_owner.pop(owner.key, None)
        if gone is None:
            return None
        on_node = self._by_node.get(gone.node, {})
        on_node.pop(owner.key, None)
        if not on_node:
            self._by_node.pop(gone.node, None)
            self._counted.pop(gone.node, None)
        self._bump(gone.node)
        ASSUMPTIONS.labels(why).inc()
        ASSUMED.dec()
        return gone

    def of(self, owner: Owner) -> Assumption | None:
        return self._by_owner.get(owner.key)

    def expire(self) -> int:
        """End every assumption older than ``ttl_s``; how many ended."""
        deadline = self.clock() - self.ttl_s
        ended = 0
        while self._by_owner:
            oldest = next(iter(self._by_owner.values()))
            if oldest.at > deadline:
                break
            self.forget(oldest.owner, "expired")
            log.info("assumption for %s on %s expired unbound", oldest.owner.describe(), oldest.node)
            ended += 1
        return ended

    @property
    def nodes(self) -> Mapping[str, object]:
        """The nodes with assumed pods (a live view: ``name in nodes`` is the cheap test)."""
        return self._by_node

    def pods_on(self, node: str) -> int:
        return len(self._by_node.get(node, ()))

    def on(self, node: str, ledger: NodeLedger) -> tuple[Allocation, ...]:
        """The allocations assumed on ``node`` beside what ``ledger`` (the view's) holds; those
        whose owner the ledger now holds are ended (``written``)."""
        for assumption in list(self._by_node.get(node, {}).values()):
            if ledger.of_owner(assumption.owner.key) is not None:
                self.forget(assumption.owner, "written")
        return tuple(a.allocation for a in self._by_node.get(node, {}).values())

    def entry(self, node: str, base: NodeEntry, slots_per_card: int, mix_isolation: bool = False) -> Counted | None:
        """``base`` (the view's entry of ``node``) with the pods assumed there counted, or None
        when there are none."""
        if node not in self._by_node:
            return None
        known = self._counted.get(node)
        if known is not None and known.base is base and known.generation == self.generation(node):
            return known
        extra = self.on(node, base.ledger)
        if not extra:
            return None
        ledger = NodeLedger(base.ledger.node, (*base.ledger.allocations, *extra))
        host = base.state
        pods = [a.pod for a in self._by_node.get(node, {}).values()]
        state = from_ledger(
            ledger,
            cpu_free=_less(host.cpu_free, sum(p.cpu_milli for p in pods)),
            mem_free=_less(host.mem_free, sum(p.memory_mib for p in pods)),
            cpu_total=host.cpu_total,
            mem_total=host.mem_total,
            slots_per_card=slots_per_card,
            mix_isolation=mix_isolation,
        )
        entry = NodeEntry(ledger, base.revision, state)
        counted = self._counted[node] = Counted(base, self.generation(node), entry)
        return counted

    def drop_answers(self) -> None:
        """Forget the derived entries and their answers (the benchmark's cold runs)."""
        self._counted.clear()

    def generation(self, node: str) -> int:
        """A number that changes whenever the node's assumptions change."""
        return self._generations.get(node, 0)

    def __len__(self) -> int:
        return len(self._by_owner)

    def _bump(self, node: str) -> None:
        self._generations[node] = self._generations.get(node, 0) + 1


def _less(free: int, taken: int) -> int:
    """What the assumed pods leave of a node's CPU or memory (untracked stays untracked)."""
    return free if free == UNTRACKED else free - taken
