"""The ledger of one node and its state transitions, as pure functions.

A ``NodeLedger`` is the value stored under the node's key; every change is a new value, written
by the caller with compare-and-set on the key's revision.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpuledger_core.errors import Exhausted, FailedPrecondition, InvalidArgument, NotFound, Released
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.mig import mig_problem
from gpuledger_core.model import Allocation, AllocState, CardMode, CardShare, Grant, Isolation, Node, Owner, Request
from gpuledger_core.room import Refusal, Want, card_state, refusal
from gpuledger_core.usage import CardUse, allocation_use, node_use, tier_problem

RELEASED_RETENTION_S = 600.0
RELEASED_KEPT = 8  # the most released allocations a node's key remembers


@dataclass(frozen=True, slots=True)
class NodeLedger:
    node: Node
    allocations: tuple[Allocation, ...] = ()
    # What the allocations hold per card, worked out on first use (a ledger never changes).
    _use: Mapping[CardUuid, CardUse] | None = field(default=None, init=False, compare=False, repr=False)

    def get(self, allocation_id: AllocationId) -> Allocation | None:
        return next((a for a in self.allocations if a.id == allocation_id), None)

    def live(self) -> tuple[Allocation, ...]:
        return tuple(a for a in self.allocations if a.live)

    def of_owner(self, owner_key: str) -> Allocation | None:
        return next((a for a in self.allocations if a.live and a.owner.key == owner_key), None)

    def use(self) -> Mapping[CardUuid, CardUse]:
        if self._use is None:
            object.__setattr__(self, "_use", MappingProxyType(node_use(self.allocations)))
        assert self._use is not None
        return self._use

    def _swap(self, allocation: Allocation) -> NodeLedger:
        kept = tuple(a if a.id != allocation.id else allocation for a in self.allocations)
        return NodeLedger(self.node, kept)


def reservation(
    allocation_id: AllocationId,
    owner: Owner,
    node: NodeName,
    grants: tuple[Grant, ...],
    requests: Sequence[Request],
    *,
    isolation: Isolation,
    now: float,
    lease_s: float,
) -> Allocation:
    """The allocation a writer reserves for ``grants`` (the cards its fit or placement chose), held
    until ``now + lease_s`` unless committed: what the allocator and placement's binder both write."""
    return Allocation(
        id=allocation_id,
        owner=owner,
        node=node,
        grants=grants,
        state=AllocState.RESERVED,
        isolation=isolation,
        created_at=now,
        updated_at=now,
        lease_expires_at=now + lease_s,
        requests=tuple(requests),
    )


def reserve(ledger: NodeLedger, allocation: Allocation, *, mix_isolation: bool = False) -> NodeLedger:
    """Add a new allocation, or raise ``Exhausted`` naming a card that does not take the
    allocation's hold on it (``share_problem``: unhealthy, short of room, or held by another
    isolation tier unless ``mix_isolation``). Its slots are its writer's to count, in the same write."""
    if allocation.node != ledger.node.name:
        raise InvalidArgument("node", f"allocation is for {allocation.node}, not {ledger.node.name}")
    if ledger.get(allocation.id) is not None:
        raise FailedPrecondition(f"allocation {allocation.id} already exists")
    use = ledger.use()
    instances: list[CardShare] = []
    for share in _merged(allocation, instances):
        problem = share_problem(ledger.node, use.get(share.uuid), share, allocation.isolation, mix_isolation)
        if problem:
            raise Exhausted(problem)
    if instances:
        problem = mig_problem(ledger.node, ledger.allocations, instances)
        if problem:
            raise Exhausted(problem)
    return NodeLedger(ledger.node, (*ledger.allocations, allocation))


def _merged(allocation: Allocation, instances: list[CardShare]) -> Iterable[CardShare]:
    """The allocation's total hold per card, as one share each; its MIG instances, each held
    whole on its own, go to ``instances`` instead (``mig.mig_problem`` checks them)."""
    for uuid, use in allocation_use(allocation).items():
        first = next(s for s in allocation.shares() if s.uuid == uuid)
        if first.mig is not None:
            instances.extend(s for s in allocation.shares() if s.uuid == uuid)
            continue
        yield CardShare(uuid, first.index, use.mem_mib, use.core_milli, use.exclusive)


def share_problem(
    node: Node, use: CardUse | None, share: CardShare, isolation: Isolation = Isolation.NONE, mix: bool = False
) -> str:
    """Why ``share``, held by a tenant of ``isolation``, does not fit on its card now (the per-card
    rule, ``room.refusal``: any model, slots not counted here); empty when it fits."""
    card = node.card(share.uuid)
    if card is None:
        return f"card {share.uuid} is not on node {node.name}"
    state = card_state(card, use)
    want = Want(share.exclusive, share.core_milli, share.mem_mib, isolation=isolation)
    found = refusal(state, want, mix)
    if found is None:
        return ""
    label = f"card {card.index} ({card.uuid}) on {node.name}"
    if found is Refusal.UNHEALTHY:
        return f"{label} is unhealthy"
    if found is Refusal.MIG:
        return f"{label} is in MIG mode: it takes MIG instances only, no share or whole card"
    if found is Refusal.HELD:
        return f"{label} is held by {use.holders if use else 0} other(s)"
    if found is Refusal.MEMORY:
        return f"{label} has {state.mem_free} MiB free, needs {share.mem_mib} MiB"
    if found is Refusal.COMPUTE:
        return f"{label} has {state.core_free / 10:g}% compute free, needs {share.core_milli / 10:g}%"
    assert found is Refusal.TIER, found  # no model is wanted, no slot counted
    return f"{label}: {tier_problem(state.tiers, isolation, mix)}"


def commit(ledger: NodeLedger, allocation_id: AllocationId, now: float) -> NodeLedger:
    """reserved -> bound (the lease ends); bound stays bound."""
    found = _existing(ledger, allocation_id)
    if found.state is AllocState.BOUND:
        return ledger
    if found.state is AllocState.RELEASED:
        raise Released(f"allocation {allocation_id} was released ({found.reason})")
    bound = replace(found, state=AllocState.BOUND, updated_at=now, lease_expires_at=None)
    return ledger._swap(bound)


def release(
    ledger: NodeLedger, allocation_id: AllocationId, now: float, reason: str = "released"
) -> NodeLedger:
    """Any live state -> released. Releasing a released allocation changes nothing."""
    found = _existing(ledger, allocation_id)
    if not found.live:
        return ledger
    gone = replace(
        found, state=AllocState.RELEASED, updated_at=now, lease_expires_at=None, reason=reason
    )
    return ledger._swap(gone)


def forget(ledger: NodeLedger, allocation_id: AllocationId) -> NodeLedger:
    """The record of a released allocation dropped, so that its id can be reserved again (a
    ResourceClaim allocated again exactly as before: its id derives from the claim and its devices).
    A live allocation, or an id the ledger does not hold, leaves the ledger as it is."""
    found = ledger.get(allocation_id)
    if found is None or found.live:
        return ledger
    return NodeLedger(ledger.node, tuple(a for a in ledger.allocations if a.id != allocation_id))


def expire(ledger: NodeLedger, now: float) -> NodeLedger:
    """Release every reservation whose lease has run out."""
    for allocation in ledger.allocations:
        if allocation.lapsed_at(now):
            ledger = release(ledger, allocation.id, now, reason="lease expired")
    return ledger


def prune(ledger: NodeLedger, now: float, keep_s: float = RELEASED_RETENTION_S) -> NodeLedger:
    """Forget released allocations older than ``keep_s``, or beyond the newest
    ``RELEASED_KEPT``, so the key stays small (a re-release within that window still succeeds)."""
    released = [a for a in ledger.allocations if not a.live]
    if len(released) <= RELEASED_KEPT and all(now - a.updated_at < keep_s for a in released):
        return ledger  # nothing to forget (the common case: spare the sorting below)
    released = [a for a in released if now - a.updated_at < keep_s]
    recent = {a.id for a in sorted(released, key=lambda a: a.updated_at)[-RELEASED_KEPT:]}
    # Released just now: kept for this write, so its release is seen (and published) once.
    if keep_s > 0:
        recent |= {a.id for a in ledger.allocations if not a.live and a.updated_at >= now}
    kept = tuple(a for a in ledger.allocations if a.live or a.id in recent)
    return ledger if len(kept) == len(ledger.allocations) else NodeLedger(ledger.node, kept)


def tidy(ledger: NodeLedger, now: float) -> NodeLedger:
    """What every write does first: expire leases, forget old releases."""
    return prune(expire(ledger, now), now)


def set_mode(ledger: NodeLedger, uuid: CardUuid, mode: CardMode) -> NodeLedger:
    """The card in ``mode``: refused (``FailedPrecondition``, naming the card) while anyone holds
    it or, leaving MIG mode, while it has GPU instances. The same mode changes nothing."""
    card = ledger.node.card(uuid)
    if card is None:
        raise NotFound(f"card {uuid} is not on node {ledger.node.name}")
    if card.mode is mode:
        return ledger
    label = f"card {card.index} ({uuid}) on {ledger.node.name}"
    holders = ledger.use().get(uuid)
    if holders is not None and holders.holders:
        raise FailedPrecondition(f"{label} has {holders.holders} holder(s): its mode changes only when it is empty")
    if card.instances:
        raise FailedPrecondition(f"{label} has {len(card.instances)} MIG instance(s): destroy them first")
    cards = tuple(replace(c, mode=mode) if c.uuid == uuid else c for c in ledger.node.cards)
    return replace(ledger, node=replace(ledger.node, cards=cards))


def with_node(ledger: NodeLedger, node: Node) -> NodeLedger:
    """New inventory for the node; allocations stay (a vanished card keeps its holders)."""
    return replace(ledger, node=node)


def next_lease_expiry(ledger: NodeLedger) -> float | None:
    leases = [
        a.lease_expires_at
        for a in ledger.allocations
        if a.state is AllocState.RESERVED and a.lease_expires_at is not None
    ]
    return min(leases, default=None)


def _existing(ledger: NodeLedger, allocation_id: AllocationId) -> Allocation:
    found = ledger.get(allocation_id)
    if found is None:
        raise NotFound(f"allocation {allocation_id} is not on node {ledger.node.name}")
    return found
