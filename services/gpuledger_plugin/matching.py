"""Which container is kubelet admitting? Pure decisions over the node's ledger.

Every container the ledger reserved on this node holds specific device IDs (``Grant.device_ids``).
``steer`` answers GetPreferredAllocation by pointing kubelet at the IDs of the container it is
about to admit; ``resolve`` turns the IDs kubelet passes to Allocate back into that container.
Neither call names the pod, so when several reservations could fit, the caller learns which pod
kubelet is admitting from PodResources (``admitting``) and decides again. See
docs/pod-identity.md for the argument and every failure case.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations

from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Grant, Node, OwnerKind
from gpuledger_core.slots import cards_of, holders_of_ids

PodKey = tuple[str, str]  # (namespace, name): PodResources has no pod UID
Served = Mapping[AllocationId, Collection[int]]
Accepts = Callable[[Allocation, int], bool] | None  # which grants a resource's call may match; None: all


@dataclass(frozen=True, slots=True)
class Slot:
    """One container's reservation: grant ``index`` of ``allocation``."""

    allocation: Allocation
    index: int

    @property
    def grant(self) -> Grant:
        return self.allocation.grants[self.index]

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(self.grant.device_ids)

    @property
    def pod(self) -> PodKey:
        return (self.allocation.owner.namespace, self.allocation.owner.name)

    def describe(self) -> str:
        return f"{self.allocation.owner.describe()} container {self.grant.container!r}"


@dataclass(frozen=True, slots=True)
class Found:
    slot: Slot
    ids: tuple[str, ...]  # the device IDs the container gets
    rehome: bool = False  # the grant moves onto ``ids`` (they differ from its reserved IDs)
    guessed: bool = False  # picked among interchangeable reservations without knowing the pod
    trade: Slot | None = None  # a look-alike pending container whose cards ``ids`` are on: swap first


@dataclass(frozen=True, slots=True)
class Ambiguous:
    candidates: tuple[Slot, ...]  # ask which pod kubelet is admitting, then decide again


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


Decision = Found | Ambiguous | Refused


def kubelet_order(allocation: Allocation, accepts: Accepts = None) -> tuple[int, ...]:
    """The order kubelet allocates a pod's containers in: init containers, then the others (of
    them, those ``accepts`` takes: the containers of one resource)."""
    inits = [i for i, g in enumerate(allocation.grants) if g.init and g.device_ids]
    apps = [i for i, g in enumerate(allocation.grants) if not g.init and g.device_ids]
    if accepts is None:
        return (*inits, *apps)
    return tuple(i for i in (*inits, *apps) if accepts(allocation, i))


def pod_allocations(ledger: NodeLedger) -> tuple[Allocation, ...]:
    return tuple(a for a in ledger.live() if a.owner.kind is OwnerKind.POD)


def next_slot(allocation: Allocation, served: Served, accepts: Accepts = None) -> Slot | None:
    done = served.get(allocation.id, ())
    index = next((i for i in kubelet_order(allocation, accepts) if i not in done), None)
    return None if index is None else Slot(allocation, index)


def pending(ledger: NodeLedger, served: Served, accepts: Accepts = None) -> tuple[Slot, ...]:
    """For every pod with containers still to admit, the next one kubelet will admit."""
    found = (next_slot(a, served, accepts) for a in pod_allocations(ledger))
    return tuple(s for s in found if s is not None)


def signature(slot: Slot, node: Node) -> tuple[object, ...]:
    """What a container would notice if it got another reservation instead of its own."""
    models = {c.uuid: c.model for c in node.cards}
    shares = sorted((models.get(s.uuid, ""), s.mem_mib, s.core_milli, s.exclusive) for s in slot.grant.cards)
    indexes = sorted(s.index for s in slot.grant.cards)
    links = sorted((ln.nvlinks, int(ln.pcie)) for a, b in combinations(indexes, 2) if (ln := node.link(a, b)))
    return (slot.allocation.isolation, tuple(shares), tuple(links))


def interchangeable(slots: Iterable[Slot], node: Node) -> bool:
    return len({signature(s, node) for s in slots}) <= 1


def choose(candidates: tuple[Slot, ...], node: Node, admitting: Collection[PodKey] | None) -> Decision:
    """One of several reservations that fit, or Ambiguous if choosing could swap limits."""
    if len(candidates) == 1:
        return Found(candidates[0], tuple(sorted(candidates[0].ids)))
    if admitting is not None:
        narrowed = tuple(c for c in candidates if c.pod in admitting)
        if len(narrowed) == 1:
            return Found(narrowed[0], tuple(sorted(narrowed[0].ids)))
        candidates = narrowed or candidates
    if interchangeable(candidates, node):
        oldest = min(candidates, key=lambda s: (s.allocation.created_at, s.allocation.id))
        return Found(oldest, tuple(sorted(oldest.ids)), guessed=True)
    return Ambiguous(candidates)


def steer(
    ledger: NodeLedger,
    served: Served,
    available: Collection[str],
    must_include: Collection[str],
    size: int,
    admitting: Collection[PodKey] | None = None,
    accepts: Accepts = None,
) -> Decision:
    """GetPreferredAllocation: the reserved IDs of the container kubelet is admitting."""
    offered = frozenset(available) | frozenset(must_include)
    if must_include:
        return _steer_within_pod(ledger, served, offered, tuple(must_include), size, accepts)
    fits = tuple(s for s in pending(ledger, served, accepts) if len(s.ids) == size and s.ids <= offered)
    if not fits:
        return Refused(f"no container on {ledger.node.name} has {size} free reserved device(s)")
    return choose(fits, ledger.node, admitting)


def _steer_within_pod(
    ledger: NodeLedger, served: Served, offered: frozenset[str], must: tuple[str, ...], size: int, accepts: Accepts
) -> Decision:
    """kubelet must reuse an init container's devices: they name the pod."""
    holders = holders_of_ids(ledger)
    owners = {holders[i] for i in must if i in holders}
    if len(owners) != 1:
        return Refused(f"devices {sorted(must)} are reserved for {len(owners)} allocations, not one")
    slot = _next_of_size(ledger.get(owners.pop()), served, size, accepts)
    if slot is None:
        return Refused(f"no container of that pod has {size} reserved device(s) left to admit")
    rest = [i for i in sorted(slot.ids) if i in offered and i not in must]
    ids = (*must, *rest)[:size] if len(must) < size else tuple(must)
    return Found(slot, tuple(ids), rehome=frozenset(ids) != slot.ids)


def _next_of_size(allocation: Allocation | None, served: Served, size: int, accepts: Accepts) -> Slot | None:
    if allocation is None:
        return None
    done = served.get(allocation.id, ())
    order = [i for i in kubelet_order(allocation, accepts) if i not in done]
    index = next((i for i in order if len(allocation.grants[i].device_ids) == size), None)
    return None if index is None else Slot(allocation, index)


def exact(ledger: NodeLedger, ids: frozenset[str], served: Served, accepts: Accepts = None) -> tuple[Slot, ...]:
    """Every container whose reserved IDs are exactly ``ids``, those still to admit first."""
    found: list[tuple[bool, int, Slot]] = []
    for allocation in pod_allocations(ledger):
        done = served.get(allocation.id, ())
        for rank, index in enumerate(kubelet_order(allocation, accepts)):
            if frozenset(allocation.grants[index].device_ids) == ids:
                found.append((index in done, rank, Slot(allocation, index)))
    return tuple(s for _, _, s in sorted(found, key=lambda f: (f[0], f[1])))


def resolve(
    ledger: NodeLedger,
    served: Served,
    device_ids: Collection[str],
    admitting: Collection[PodKey] | None = None,
    steered: Slot | None = None,
    accepts: Accepts = None,
) -> Decision:
    """Allocate: the container whose reservation the IDs kubelet chose belong to."""
    ids = frozenset(device_ids)
    ordered = tuple(sorted(ids))
    if steered is not None and steered.ids == ids:
        return Found(steered, ordered)
    matches = exact(ledger, ids, served, accepts)
    if matches:
        return _confirm(ledger, served, matches[0], admitting, accepts)
    holders = holders_of_ids(ledger)
    owners = {holders[i] for i in ids if i in holders}
    if len(owners) > 1:
        names = sorted(_describe(ledger, o) for o in owners)
        return Refused(f"devices {list(ordered)} are reserved for different pods: {', '.join(names)}")
    if owners:
        return _within_pod(ledger, served, ids, owners.pop(), holders, accepts)
    fits = tuple(s for s in pending(ledger, served, accepts) if len(s.ids) == len(ids))
    if not fits:
        return Refused(f"no container on {ledger.node.name} has a reservation for {len(ids)} device(s)")
    decided = choose(fits, ledger.node, admitting)
    if isinstance(decided, Found):
        trade = _trade(decided.slot, ids, fits, ledger.node)
        return Found(decided.slot, ordered, rehome=True, guessed=decided.guessed, trade=trade)
    return decided


def _trade(slot: Slot, ids: frozenset[str], pending_slots: tuple[Slot, ...], node: Node) -> Slot | None:
    """Free IDs on cards another pending container reserved, one that looks like ``slot``'s: the
    two trade reservations before ``slot`` moves onto the IDs. Neither is admitted yet and which
    of them holds which cards makes no difference to either; without it the move is refused
    whenever that reservation holds the cards whole."""
    cards = cards_of(ids)
    if cards_of(slot.ids) == cards:
        return None
    mine = signature(slot, node)
    return next(
        (s for s in pending_slots if cards_of(s.ids) == cards and s != slot and signature(s, node) == mine),
        None,
    )


def _within_pod(
    ledger: NodeLedger,
    served: Served,
    ids: frozenset[str],
    owner: AllocationId,
    holders: Mapping[str, AllocationId],
    accepts: Accepts,
) -> Decision:
    """Some IDs are reserved for one pod: fine if they are its own, reused from its init
    containers (already admitted); otherwise kubelet took another pod's reservation."""
    allocation = ledger.get(owner)
    assert allocation is not None
    done = served.get(owner, ())
    reusable = {i for n in done for i in allocation.grants[n].device_ids}
    touched = {i for i in ids if holders.get(i) == owner}
    ordered = tuple(sorted(ids))
    if not touched <= reusable:
        return Refused(
            f"kubelet chose devices {sorted(touched - reusable)} reserved for "
            f"{allocation.owner.describe()} (it did not follow GetPreferredAllocation); "
            "refusing rather than taking another pod's reservation"
        )
    slot = _next_of_size(allocation, served, len(ids), accepts)
    if slot is None:
        return Refused(f"devices {list(ordered)} belong to a pod with no container left to admit")
    return Found(slot, ordered, rehome=frozenset(ids) != slot.ids)


def _confirm(
    ledger: NodeLedger, served: Served, match: Slot, admitting: Collection[PodKey] | None, accepts: Accepts
) -> Decision:
    """An exact match that kubelet was not steered to: check no other pod could be meant."""
    rivals = tuple(
        s
        for s in pending(ledger, served, accepts)
        if s.allocation.id != match.allocation.id and len(s.ids) == len(match.ids)
    )
    if not rivals or interchangeable((match, *rivals), ledger.node):
        return Found(match, tuple(sorted(match.ids)))
    if admitting is None:
        return Ambiguous((match, *rivals))
    if match.pod in admitting or not any(r.pod in admitting for r in rivals):
        return Found(match, tuple(sorted(match.ids)))
    meant = next(r for r in rivals if r.pod in admitting)
    return Refused(
        f"kubelet gave {meant.describe()} the devices reserved for {match.describe()}; "
        "refusing rather than swapping their cards and limits"
    )


def _describe(ledger: NodeLedger, allocation_id: AllocationId) -> str:
    found = ledger.get(allocation_id)
    return found.owner.describe() if found else str(allocation_id)
