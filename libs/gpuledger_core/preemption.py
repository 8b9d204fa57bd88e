"""Which holders to take cards back from so that a pod fits: share-aware preemption. Pure: no I/O.

kube-scheduler's preemption counts a node's ``gpuledger.io/gpu`` slots, not what each holder holds
of which card, so it cannot know that two 2 GiB shares on one card free room for a 4 GiB pod and
two on different cards do not. Here the victims are chosen on the ledger, card by card, with the
same fit as every placement (``pods.plan``):

- **who may go**: a live holder whose priority is below the pod's (``Holder``); holders preemption
  knows nothing of (tools, pods it has no priority for) never go;
- **on which cards**: for a pod whose cards come from one container (the usual pod), the candidates
  are grouped by the cards they free: per card for a one-card pod; for an n-card pod, the n cards
  whose own groups cost least (cards that already take it cost nothing; cards held only by
  holders that may not go are no choice). A pod of several
  containers takes its candidates from the whole node;
- **the smallest set**: within a group, each victim is given back its cards in turn, the one whose
  eviction would hurt most first (one a PodDisruptionBudget protects, then the highest priority, then
  the one that ran longest), and stays if the pod still fits without evicting it. What remains is a
  set from which no victim can be spared: never a victim that would not help;
- **the host too**: where the node's free CPU and memory are known (``HostFree``) and would not take
  the pod once the card victims are gone, further lower-priority holders there go for the host
  (each holder's ``cpu_milli`` and ``memory_mib``), chosen as kube-scheduler's dry run chooses: all
  of them off, then given back the costliest first while the host still takes the pod. They count
  in the set's cost, so a node whose cards and host are freed by fewer victims wins over one whose
  cards alone are cheap; a node whose host would not take the pod even then is no choice;
- **the cheapest node and group**, as kube-scheduler orders its candidates: fewest victims a
  PodDisruptionBudget protects, then the lowest highest priority among the victims, then the fewest
  victims, then the lowest sum of their priorities, then the least work lost (the victims'
  run time summed: the youngest go first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import share_for
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, share_problem
from gpuledger_core.model import Allocation, Grant, Request
from gpuledger_core.packing import Policy
from gpuledger_core.pods import PodAsk, plan

PREEMPTED_BY = "preempted by "  # how the reason of an entry that preemption released begins
MOVED_FOR = "moved for "  # and one that defragmentation released (its pod moved elsewhere)


def preempted(allocation: Allocation | None) -> bool:
    """Whether this released entry was taken back by preemption or defragmentation (its claim,
    still allocated in the API until its pods are gone, is not to be held again)."""
    return allocation is not None and not allocation.live and allocation.reason.startswith((PREEMPTED_BY, MOVED_FOR))


def room_held(allocation: Allocation | None) -> bool:
    """Whether this live entry of a claim is the room preemption holds for it (a lease, not yet
    the claim's allocation, which has none)."""
    return allocation is not None and allocation.live and allocation.lease_expires_at is not None


@dataclass(frozen=True, slots=True)
class Holder:
    """What preemption knows of a holder beyond the ledger: its priority, whether a
    PodDisruptionBudget forbids its eviction now, and when it started (the work its eviction loses)."""

    priority: int
    protected: bool = False
    started_at: float = 0.0
    cpu_milli: int = 0  # what its pods ask of the node's host, freed there when it goes
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class HostFree:
    """A node's host CPU and memory free now (kube-scheduler's requests' count), as far as the
    caller follows it: the victims must free what the pod asks beyond it."""

    cpu_milli: int
    memory_mib: int

    def takes(self, pod: PodAsk, freed: Iterable[Holder]) -> bool:
        """Whether the host takes ``pod`` once the holders ``freed`` are gone."""
        gone = list(freed)
        cpu = self.cpu_milli + sum(h.cpu_milli for h in gone)
        memory = self.memory_mib + sum(h.memory_mib for h in gone)
        return cpu >= pod.cpu_milli and memory >= pod.memory_mib


@dataclass(frozen=True, slots=True)
class Victims:
    """The holders to evict on ``node`` for the pod to fit there, and the cards it would then get."""

    node: NodeName
    evict: tuple[Allocation, ...]  # lowest priority first, then youngest
    grants: tuple[Grant, ...]
    cost: tuple[int, int, int, int, float]  # protected, highest priority, count, priority sum, work lost

    def describe(self) -> str:
        names = ", ".join(a.owner.describe() for a in self.evict) or "nobody"
        return f"{self.node}: {names}"


@dataclass(frozen=True, slots=True)
class Fit:
    """How the pod fits a node: the policy, the ledger's slot count and isolation rule."""

    policy: Policy
    slots_per_card: int | None = None
    mix_isolation: bool = False

    def grants(self, ledger: NodeLedger, pod: PodAsk, gone: Iterable[AllocationId]) -> tuple[Grant, ...] | None:
        """The pod's cards on ``ledger`` without the allocations ``gone``; None when it does not fit."""
        dropped = frozenset(gone)
        kept = NodeLedger(ledger.node, tuple(a for a in ledger.allocations if a.id not in dropped))
        try:
            return plan(  # NVLink constraints kept, as mode C places such a claim
                kept, pod, self.policy, slots_per_card=self.slots_per_card, mix_isolation=self.mix_isolation
            )
        except Exhausted:
            return None


def candidates(ledger: NodeLedger, priority: int, holders: Mapping[str, Holder], now: float) -> tuple[Allocation, ...]:
    """The node's live holders of lower priority than ``priority`` that preemption knows of."""
    found = []
    for allocation in ledger.live():
        holder = holders.get(allocation.owner.key)
        if allocation.held_at(now) and holder is not None and holder.priority < priority:
            found.append(allocation)
    return tuple(found)


def on_node(
    ledger: NodeLedger,
    pod: PodAsk,
    priority: int,
    holders: Mapping[str, Holder],
    fit: Fit,
    now: float,
    host: HostFree | None = None,
) -> Victims | None:
    """The cheapest smallest set of victims on this node that makes ``pod`` fit, its cards and, with
    ``host``, its host (further victims for CPU and memory counted in); None when evicting every
    candidate would not. A pod that fits already gets an empty set."""
    grants = fit.grants(ledger, pod, ())
    if grants is not None and (host is None or host.takes(pod, ())):
        return Victims(ledger.node.name, (), grants, (0, 0, 0, 0, 0.0))
    if host is None:
        return next(iter(options(ledger, pod, priority, holders, fit, now)), None)
    pool = candidates(ledger, priority, holders, now)
    cards = [Victims(ledger.node.name, (), grants, (0, 0, 0, 0, 0.0))] if grants is not None else []
    found = [
        victims
        for option in cards or options(ledger, pod, priority, holders, fit, now)
        if (victims := _with_host(option, pod, pool, holders, host, now)) is not None
    ]
    return min(found, key=lambda v: v.cost, default=None)


def options(
    ledger: NodeLedger, pod: PodAsk, priority: int, holders: Mapping[str, Holder], fit: Fit, now: float
) -> list[Victims]:
    """Every group's smallest set on this node that makes ``pod`` fit (per card, the cheapest
    cards, the whole pool), cheapest first: for a caller that must pass over some (defragmentation,
    whose victims must fit elsewhere)."""
    pool = candidates(ledger, priority, holders, now)
    if not pool or fit.grants(ledger, pod, (a.id for a in pool)) is None:
        return []
    found = [
        victims
        for group in _groups(ledger, pod, pool, holders, fit, now)
        if (victims := _smallest(ledger, pod, group, holders, fit, now)) is not None
    ]
    return sorted(found, key=lambda v: v.cost)


def choose(
    ledgers: Sequence[NodeLedger],
    pod: PodAsk,
    priority: int,
    holders: Mapping[str, Holder],
    fit: Fit,
    now: float,
    hosts: Mapping[NodeName, HostFree] | None = None,
) -> Victims | None:
    """The node and victims that cost least (``on_node`` for each, with its host where ``hosts``
    knows it), nodes in the given order on a tie."""
    best: Victims | None = None
    for ledger in ledgers:
        host = None if hosts is None else hosts.get(ledger.node.name)
        found = on_node(ledger, pod, priority, holders, fit, now, host)
        if found is not None and (best is None or found.cost < best.cost):
            best = found
    return best


def _groups(
    ledger: NodeLedger,
    pod: PodAsk,
    pool: tuple[Allocation, ...],
    holders: Mapping[str, Holder],
    fit: Fit,
    now: float,
) -> list[tuple[Allocation, ...]]:
    """The candidate sets to shrink: per card (or per cheapest set of cards) for a one-container
    pod, else the whole pool. The whole pool comes last, in case no card's group alone helps (a
    victim's init container, say, held more than its app containers)."""
    single = pod.single()
    if single is None or single.request is None:
        return [pool]
    by_card: dict[CardUuid, list[Allocation]] = {card.uuid: [] for card in ledger.node.cards}
    for allocation in pool:
        for uuid in {share.uuid for share in allocation.shares()}:
            by_card.setdefault(uuid, []).append(allocation)
    count = single.request.count
    if count == 1:
        groups = [tuple(group) for group in by_card.values() if group]
    else:
        # A card with no candidates costs nothing only if it takes the pod already; one held by
        # holders that may not go is no choice at all.
        usable = [group for uuid, group in by_card.items() if group or _takes(ledger, uuid, single.request)]
        ranked = sorted(usable, key=lambda group: (bool(group), _cost(group, holders, now)))
        chosen: dict[AllocationId, Allocation] = {}
        for group in ranked[:count]:
            chosen.update((a.id, a) for a in group)
        groups = [tuple(chosen.values())] if chosen else []
    return [*groups, pool]


def _takes(ledger: NodeLedger, uuid: CardUuid, request: Request) -> bool:
    """Whether the card takes a share of ``request`` as the ledger stands."""
    card = ledger.node.card(uuid)
    if card is None or not request.allows(card.model):
        return False
    return not share_problem(ledger.node, ledger.use().get(uuid), share_for(card, request))


def _smallest(
    ledger: NodeLedger,
    pod: PodAsk,
    group: tuple[Allocation, ...],
    holders: Mapping[str, Holder],
    fit: Fit,
    now: float,
) -> Victims | None:
    """``group`` with every victim the pod can spare given back, the costliest first; None when
    evicting all of ``group`` does not make the pod fit."""
    first = fit.grants(ledger, pod, (a.id for a in group))
    if first is None:
        return None
    planned = [first]

    def fits(trial: list[Allocation]) -> bool:
        grants = fit.grants(ledger, pod, (a.id for a in trial))
        if grants is not None:
            planned.append(grants)  # the last one is the plan of the victims kept
        return grants is not None

    kept = _reprieved(group, fits, holders, now)
    return _victims(ledger.node.name, kept, planned[-1], holders, now)


def _with_host(
    option: Victims,
    pod: PodAsk,
    pool: tuple[Allocation, ...],
    holders: Mapping[str, Holder],
    host: HostFree,
    now: float,
) -> Victims | None:
    """``option`` with the further candidates the host must lose for the pod's CPU and memory (all
    off, then the costliest given back while the host still takes the pod: none that would not
    help), its cost over them all; None when the host would not take the pod even so."""
    chosen = {a.id for a in option.evict}
    freed = [holders[a.owner.key] for a in option.evict]
    if host.takes(pod, freed):
        return option

    def fits(trial: Sequence[Allocation]) -> bool:
        return host.takes(pod, [*freed, *(holders[a.owner.key] for a in trial)])

    extra = [a for a in pool if a.id not in chosen]
    if not fits(extra):
        return None
    kept = [*option.evict, *_reprieved(extra, fits, holders, now)]
    return _victims(option.node, kept, option.grants, holders, now)


def _reprieved(
    candidates: Sequence[Allocation],
    fits: Callable[[list[Allocation]], bool],
    holders: Mapping[str, Holder],
    now: float,
) -> list[Allocation]:
    """``candidates`` with each given back, the costliest first, while ``fits`` still holds for
    the rest (it holds for all of them): none kept that would not help."""
    kept = list(candidates)
    for allocation in sorted(candidates, key=lambda a: _dearness(a, holders, now), reverse=True):
        trial = [a for a in kept if a.id != allocation.id]
        if fits(trial):
            kept = trial
    return kept


def _victims(
    node: NodeName, kept: Sequence[Allocation], grants: tuple[Grant, ...], holders: Mapping[str, Holder], now: float
) -> Victims:
    """The victims in the order they are evicted (``_order``), with their cost."""
    order = sorted(kept, key=lambda a: _order(a, holders))
    return Victims(node, tuple(order), grants, _cost(kept, holders, now))


def _order(allocation: Allocation, holders: Mapping[str, Holder]) -> tuple[int, float, str]:
    """The victims' order: lowest priority first, then the youngest."""
    holder = holders[allocation.owner.key]
    return (holder.priority, -holder.started_at, allocation.id)


def _dearness(allocation: Allocation, holders: Mapping[str, Holder], now: float) -> tuple[bool, int, float, str]:
    holder = holders[allocation.owner.key]
    return (holder.protected, holder.priority, now - holder.started_at, allocation.id)


def _cost(group: Iterable[Allocation], holders: Mapping[str, Holder], now: float) -> tuple[int, int, int, int, float]:
    known = [holders[a.owner.key] for a in group]
    if not known:
        return (0, 0, 0, 0, 0.0)
    return (
        sum(1 for h in known if h.protected),
        max(h.priority for h in known),
        len(known),
        sum(h.priority for h in known),
        sum(max(0.0, now - h.started_at) for h in known),
    )
