"""The allocator's operations: allocate, reserve, commit, release, and the read side.

Every change is one compare-and-set on one node's key. The owner index makes Allocate
idempotent across replicas: the reservation and the owner's record are written at once, and a
request that finds another live allocation recorded for its owner rolls its own back. Records
expire after ``OWNER_TTL_S``; by then every replica's view answers a retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gpuledger_allocator.owner_claims import MAX_OWNER_ROUNDS, OWNER_POLL_S, OwnerClaims
from gpuledger_allocator.reserving import AllocateCall, NodeFinder, NodeTrials, find, must, release_fn
from gpuledger_allocator.view import ClusterView
from gpuledger_common.store import LedgerStore
from gpuledger_common.store.outage import within
from gpuledger_core.errors import Conflict, Exhausted, InvalidArgument, NotFound, Released, Unavailable
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import commit
from gpuledger_core.model import Allocation, AllocState, OwnerKind
from gpuledger_core.pods import expand_models
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD

log = logging.getLogger(__name__)
T = TypeVar("T")
VIEW_WAIT_S = 0.5  # how long a lookup waits for the view before reading every node's key
OWNER_TTL_S = 600.0  # an Allocate's owner record lives this long; later retries are answered from the view
ABSENT_GRACE_S = 30.0  # a record naming an allocation not in the ledger is trusted this long
MAY_BE_WRITTEN = "the allocation may still be written: Allocate asked again for the same owner answers with it if so"
DUPLICATE_WAITS = 5  # tries of a reservation that duplicates of the request may be crowding out


def new_allocation_id() -> AllocationId:
    return AllocationId(f"a-{secrets.token_hex(8)}")


@dataclass(slots=True)
class AllocatorService(NodeTrials, OwnerClaims):
    """The allocator's operations over the ledger store and this replica's view of it; how an
    Allocate tries nodes is ``NodeTrials``' (reserving.py), how it settles with the owner index
    ``OwnerClaims``' (owner_claims.py)."""

    store: LedgerStore
    view: ClusterView
    finder: NodeFinder
    lease_s: float = 60.0
    max_lease_s: float = 3600.0
    clock: Callable[[], float] = time.time
    owner_ttl_s: float = OWNER_TTL_S
    absent_grace_s: float = ABSENT_GRACE_S
    slots_per_card: int = DEFAULT_SLOTS_PER_CARD  # a tool's allocation holds one slot of each card
    mix_isolation: bool = False  # whether mps and none tenants may share a card
    _background: set[asyncio.Task[None]] = field(default_factory=set)

    async def allocate(self, call: AllocateCall) -> tuple[Allocation, bool]:
        """Reserve (and with ``commit``, commit) cards for the owner; the owner's existing
        allocation if it has one. The reservation and the owner's record are written at once.
        Its ledger writes share one outage window (``store.retry_s``), as do every call's. When
        the window ends, ``Unavailable`` says that the allocation may still be written (a write
        sent before a leader was lost can be applied once a quorum is back), and that asking
        again for the same owner answers with it if so."""
        try:
            with within(self.store.retry_s):
                return await self._allocate(call)
        except Unavailable as err:  # a write whose answer was lost may still land (docs/ledger.md)
            raise Unavailable(f"{err}; {MAY_BE_WRITTEN}") from err

    async def _allocate(self, call: AllocateCall) -> tuple[Allocation, bool]:
        lease = self._lease(call.lease_s)
        call = self._with_known_models(call)
        held = await self._held(call.owner)
        if held is not None:
            with contextlib.suppress(Released):  # released before its commit: allocate anew
                return (await self._finish(held, call.commit)), True
        for _ in range(MAX_OWNER_ROUNDS):
            nodes = await self._nodes_for(call)
            allocation_id = new_allocation_id()
            first = nodes[0].node if nodes else NodeName("")
            started = time.monotonic()
            claim = self.store.claim_owner(call.owner, allocation_id, first, ttl_s=self.owner_ttl_s)
            claiming = asyncio.ensure_future(claim)  # written beside the reservation, not after it
            try:
                reserved = await _outcome(self._reserve_on(call, nodes, allocation_id, lease))
            finally:
                claimed = await _outcome(claiming)
            if isinstance(claimed, int) and isinstance(reserved, Exhausted) and self.view.owned_by(call.owner):
                reserved = await self._reserve_again(call, allocation_id, lease, reserved)
            outcome = await self._settle(call.owner, claimed, reserved, first, started)
            if outcome is not None:
                # Released before its commit (its lease ran out while the ledger was out of reach,
                # or the owner released it meanwhile): the owner asked for cards, so it gets new ones.
                with contextlib.suppress(Released):
                    return (await self._finish(outcome[0], call.commit)), outcome[1]
        raise Conflict(f"{call.owner.describe()}: the owner index kept changing; retry")

    async def _reserve_again(
        self, call: AllocateCall, allocation_id: AllocationId, lease: float, refused: Exhausted
    ) -> Allocation | BaseException:
        """This request holds the owner's record but found no room, while the owner holds other
        reservations: duplicates of this very request (the same owner asking several replicas at
        once), which give their room back when they find the record. Try again a few times, briefly."""
        for _ in range(DUPLICATE_WAITS):
            await asyncio.sleep(OWNER_POLL_S)
            reserved = await _outcome(self._reserve_on(call, await self._nodes_for(call), allocation_id, lease))
            if not isinstance(reserved, Exhausted):
                return reserved
        return refused

    async def commit(self, allocation_id: AllocationId, node: NodeName | None = None) -> Allocation:
        with within(self.store.retry_s):
            return await self._commit(allocation_id, node)

    async def _commit(self, allocation_id: AllocationId, node: NodeName | None) -> Allocation:
        node = node or await self._node_of(allocation_id)
        written = await self.store.mutate(node, lambda ledger: commit(must(ledger, node), allocation_id, self.clock()))
        return find(written.new, allocation_id)

    async def release(self, allocation_id: AllocationId, reason: str = "released") -> Allocation:
        """Release the allocation; the answer waits for the ledger only. The owner record an
        Allocate wrote expires by itself (``owner_ttl_s``), and until then a new Allocate by the
        same owner finds it names nothing live and replaces it. A pod's record (written by the
        scheduler's bind, without a TTL), and every record where the server keeps no TTLs, is
        dropped after the answer."""
        with within(self.store.retry_s):
            return await self._release(allocation_id, reason)

    async def _release(self, allocation_id: AllocationId, reason: str) -> Allocation:
        node = await self._node_of(allocation_id)
        written = await self.store.mutate(node, release_fn(node, allocation_id, self.clock(), reason))
        released = find(written.new, allocation_id)
        if released.owner.kind is OwnerKind.POD or not self.store.records_expire:
            self._later(self._forget(released.owner, allocation_id))
        return released

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Wait for the work left after answers (owner records to drop); for shutdown."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_s)

    async def get(self, allocation_id: AllocationId) -> Allocation:
        with within(self.store.retry_s):
            node = await self._node_of(allocation_id)
            ledger, _ = await self.store.read(node)
            return find(ledger, allocation_id)

    async def sweep(self) -> int:
        """Expire reservations whose lease ran out; returns how many nodes were tidied."""
        now = self.clock()
        tidied = 0
        for name, ledger in list(self.view.ledgers.items()):
            if any(a.lapsed_at(now) for a in ledger.allocations):
                await self.store.mutate(name, lambda current: current)  # mutate tidies first
                tidied += 1
        return tidied

    # --- helpers ---

    def _with_known_models(self, call: AllocateCall) -> AllocateCall:
        """Model selectors name models as placement reads them (``A100`` means every card whose
        model has the word A100); spell them out as the cards in the ledger name them."""
        if not any(a.request.models for a in call.asks):
            return call
        known = {card.model for ledger in self.view.ledgers.values() for card in ledger.node.cards}
        asks = tuple(
            replace(a, request=replace(a.request, models=expand_models(a.request.models, known))) for a in call.asks
        )
        return replace(call, asks=asks)

    def _lease(self, asked: float | None) -> float:
        if asked is None or asked == 0:
            return self.lease_s
        if not 0 < asked <= self.max_lease_s:
            raise InvalidArgument("lease_seconds", f"must be 1..{self.max_lease_s:g}, got {asked:g}")
        return asked

    async def _finish(self, allocation: Allocation, want_commit: bool) -> Allocation:
        if want_commit and allocation.state is AllocState.RESERVED:
            return await self._commit(allocation.id, allocation.node)
        return allocation

    async def _node_of(self, allocation_id: AllocationId) -> NodeName:
        """Where the allocation lives. One just made by another replica reaches this replica's
        view within moments: wait that long before reading every node's key."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + VIEW_WAIT_S
        while (node := self.view.node_of(allocation_id)) is None and (left := deadline - loop.time()) > 0:
            await self.view.changed(left)
        if node is not None:
            return node
        for name, (ledger, _) in (await self.store.nodes()).items():
            if ledger.get(allocation_id) is not None:
                return name
        raise NotFound(f"allocation {allocation_id} does not exist (or was released long ago)")


async def _outcome(work: Awaitable[T]) -> T | BaseException:
    """What ``work`` returned, or what it raised (as ``gather(return_exceptions=True)`` has it)."""
    try:
        return await work
    except Exception as err:
        return err
