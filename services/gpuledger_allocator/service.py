"""The allocator's operations: allocate, reserve, commit, release, and the read side.

Every change is one compare-and-set on one node's key; the owner index makes Allocate
idempotent across replicas (reserve first, then claim the owner; the loser rolls back).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from gpuledger_core.errors import Conflict, Exhausted, InvalidArgument, NotFound
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, commit, release, reserve
from gpuledger_core.model import Allocation, AllocState, Isolation, Owner
from gpuledger_common.store import LedgerStore
from gpuledger_allocator.view import ClusterView

log = logging.getLogger(__name__)
MAX_OWNER_ROUNDS = 3
MAX_REASONS = 5


class Placer(Protocol):
    async def candidates(self, view: ClusterView, asks: Sequence[ContainerAsk]) -> list[NodeName]:
        """Nodes to try for this request, best first."""
        ...


@dataclass(frozen=True, slots=True)
class AllocateCall:
    owner: Owner
    asks: tuple[ContainerAsk, ...]
    isolation: Isolation = Isolation.NONE
    lease_s: float | None = None
    commit: bool = False
    node: NodeName | None = None

    def __post_init__(self) -> None:
        if not self.asks:
            raise InvalidArgument("containers", "at least one container request is needed")
        names = [a.container for a in self.asks]
        if len(set(names)) != len(names):
            raise InvalidArgument("containers", f"container names repeat: {names}")


def new_allocation_id() -> AllocationId:
    return AllocationId(f"a-{secrets.token_hex(8)}")


@dataclass(slots=True)
class AllocatorService:
    store: LedgerStore
    view: ClusterView
    placer: Placer
    lease_s: float = 60.0
    max_lease_s: float = 3600.0
    clock: Callable[[], float] = time.time

    async def allocate(self, call: AllocateCall) -> tuple[Allocation, bool]:
        lease = self._lease(call.lease_s)
        for _ in range(MAX_OWNER_ROUNDS):
            existing = await self._owned(call.owner)
            if existing is not None:
                return (await self._finish(existing, call.commit)), True
            allocation = await self._reserve_somewhere(call, lease)
            if await self.store.claim_owner(call.owner, allocation.id, allocation.node):
                return (await self._finish(allocation, call.commit)), False
            # Another replica served the same owner first: keep theirs, undo ours.
            undo = _release_fn(allocation.node, allocation.id, self.clock(), "duplicate request")
            await self.store.mutate(allocation.node, undo)
        raise Conflict(f"{call.owner.describe()}: the owner index kept changing; retry")

    async def reserve_exact(self, allocation: Allocation) -> tuple[Allocation, bool]:
        """Reserve cards already chosen by the caller (placement's bind): one CAS, or Exhausted."""
        for _ in range(MAX_OWNER_ROUNDS):
            existing = await self._owned(allocation.owner)
            if existing is not None:
                return existing, True
            now = self.clock()
            lease = allocation.lease_expires_at or now + self.lease_s
            fresh = replace(allocation, state=AllocState.RESERVED, created_at=now, updated_at=now, lease_expires_at=lease)
            await self.store.mutate(allocation.node, _reserve_fn(fresh))
            if await self.store.claim_owner(fresh.owner, fresh.id, fresh.node):
                return fresh, False
            undo = _release_fn(fresh.node, fresh.id, self.clock(), "duplicate request")
            await self.store.mutate(fresh.node, undo)
        raise Conflict(f"{allocation.owner.describe()}: the owner index kept changing; retry")

    async def commit(self, allocation_id: AllocationId) -> Allocation:
        node = await self._node_of(allocation_id)
        written = await self.store.mutate(node, lambda ledger: commit(_must(ledger, node), allocation_id, self.clock()))
        return _find(written.new, allocation_id)

    async def release(self, allocation_id: AllocationId, reason: str = "released") -> Allocation:
        node = await self._node_of(allocation_id)
        written = await self.store.mutate(node, _release_fn(node, allocation_id, self.clock(), reason))
        released = _find(written.new, allocation_id)
        owned = await self.store.owner_of(released.owner)
        if owned is not None and owned[0] == allocation_id:
            await self.store.forget_owner(released.owner, owned[2])
        return released

    async def get(self, allocation_id: AllocationId) -> Allocation:
        node = await self._node_of(allocation_id)
        ledger, _ = await self.store.read(node)
        return _find(ledger, allocation_id)

    async def sweep(self) -> int:
        """Expire reservations whose lease ran out; returns how many nodes were tidied."""
        now = self.clock()
        tidied = 0
        for name, ledger in list(self.view.ledgers.items()):
            if any(a.state is AllocState.RESERVED and (a.lease_expires_at or now + 1) <= now for a in ledger.allocations):
                await self.store.mutate(name, lambda current: current)  # mutate tidies first
                tidied += 1
        return tidied

    # --- helpers ---

    def _lease(self, asked: float | None) -> float:
        if asked is None or asked == 0:
            return self.lease_s
        if not 0 < asked <= self.max_lease_s:
            raise InvalidArgument("lease_seconds", f"must be 1..{self.max_lease_s:g}, got {asked:g}")
        return asked

    async def _owned(self, owner: Owner) -> Allocation | None:
        """The owner's live allocation, dropping a record that points at nothing live."""
        record = await self.store.owner_of(owner)
        if record is None:
            return None
        allocation_id, node, revision = record
        ledger, _ = await self.store.read(node)
        found = ledger.get(allocation_id) if ledger else None
        if found is not None and found.live:
            return found
        await self.store.forget_owner(owner, revision)
        return None

    async def _finish(self, allocation: Allocation, want_commit: bool) -> Allocation:
        if want_commit and allocation.state is AllocState.RESERVED:
            return await self.commit(allocation.id)
        return allocation

    async def _reserve_somewhere(self, call: AllocateCall, lease_s: float) -> Allocation:
        nodes = [call.node] if call.node else await self.placer.candidates(self.view, call.asks)
        if call.node and call.node not in self.view.ledgers:
            raise NotFound(f"node {call.node} is not in the ledger")
        reasons: list[str] = [] if nodes else self._why_nowhere(call)
        for node in nodes:
            if self.view.stale(node):
                reasons.append(f"{node}: stale (no heartbeat for {self.view.stale_after_s:g}s)")
                continue
            allocation_id = new_allocation_id()
            try:
                written = await self.store.mutate(node, self._fit_and_reserve(call, node, allocation_id, lease_s))
            except (Exhausted, Conflict) as err:
                reasons.append(str(err))
                continue
            return _find(written.new, allocation_id)
        raise Exhausted(_no_fit(call, nodes, reasons))

    def _why_nowhere(self, call: AllocateCall) -> list[str]:
        reasons: list[str] = []
        for ledger in self.view.ledgers.values():
            try:
                fit_node(ledger, call.asks)
            except Exhausted as err:
                reasons.append(str(err))
        return reasons or ["the ledger has no nodes"]

    def _fit_and_reserve(
        self, call: AllocateCall, node: NodeName, allocation_id: AllocationId, lease_s: float
    ) -> Callable[[NodeLedger | None], NodeLedger | None]:
        def transition(ledger: NodeLedger | None) -> NodeLedger:
            current = _must(ledger, node)
            grants = fit_node(current, call.asks)
            now = self.clock()
            allocation = Allocation(
                id=allocation_id, owner=call.owner, node=node, grants=grants,
                state=AllocState.RESERVED, isolation=call.isolation,
                created_at=now, updated_at=now, lease_expires_at=now + lease_s,
                requests=tuple(a.request for a in call.asks),
            )
            return reserve(current, allocation)

        return transition

    async def _node_of(self, allocation_id: AllocationId) -> NodeName:
        node = self.view.node_of(allocation_id)
        if node is not None:
            return node
        for name, (ledger, _) in (await self.store.nodes()).items():
            if ledger.get(allocation_id) is not None:
                return name
        raise NotFound(f"allocation {allocation_id} does not exist (or was released long ago)")


def _must(ledger: NodeLedger | None, node: str) -> NodeLedger:
    if ledger is None:
        raise NotFound(f"node {node} is not in the ledger")
    return ledger


def _find(ledger: NodeLedger | None, allocation_id: AllocationId) -> Allocation:
    found = ledger.get(allocation_id) if ledger else None
    if found is None:
        raise NotFound(f"allocation {allocation_id} does not exist (or was released long ago)")
    return found


def _reserve_fn(allocation: Allocation) -> Callable[[NodeLedger | None], NodeLedger]:
    return lambda ledger: reserve(_must(ledger, allocation.node), allocation)


def _release_fn(
    node: str, allocation_id: AllocationId, now: float, reason: str
) -> Callable[[NodeLedger | None], NodeLedger]:
    return lambda ledger: release(_must(ledger, node), allocation_id, now, reason)


def _no_fit(call: AllocateCall, nodes: Sequence[str], reasons: list[str]) -> str:
    what = call.owner.describe()
    shown = "; ".join(reasons[:MAX_REASONS])
    more = f" (and {len(reasons) - MAX_REASONS} more nodes)" if len(reasons) > MAX_REASONS else ""
    return f"{what} fits on no node: {shown}{more}"
