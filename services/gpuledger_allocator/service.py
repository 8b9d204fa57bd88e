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
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from gpuledger_allocator.view import ClusterView
from gpuledger_common.store import LedgerStore, OwnerRecord
from gpuledger_common.store.outage import time_left, within
from gpuledger_core.errors import (
    Conflict,
    Exhausted,
    GpuledgerError,
    InvalidArgument,
    NotFound,
    Released,
    Unavailable,
)
from gpuledger_core.fit import ContainerAsk, Tier, fit_node, share_for
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, commit, release, reservation, reserve
from gpuledger_core.model import Allocation, AllocState, Card, Grant, Isolation, Owner, OwnerKind
from gpuledger_core.pods import expand_models
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD, slot_problem

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_OWNER_ROUNDS = 3
VIEW_WAIT_S = 0.5  # how long a lookup waits for the view before reading every node's key
MAX_REASONS = 5
OWNER_TTL_S = 600.0  # an Allocate's owner record lives this long; later retries are answered from the view
ABSENT_GRACE_S = 30.0  # a record naming an allocation not in the ledger is trusted this long
OWNER_POLL_S = 0.02
FIRST_PASS_ATTEMPTS = 1  # a node whose race this request lost is left for the end: others are tried first
MAY_BE_WRITTEN = "the allocation may still be written: Allocate asked again for the same owner answers with it if so"
DUPLICATE_WAITS = 5  # tries of a reservation that duplicates of the request may be crowding out


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node to try, and optionally the cards to try first there: card indexes per container, in
    the order of the request's containers (placement's topology-aware choice)."""

    node: NodeName
    cards: tuple[tuple[int, ...], ...] | None = None


class NodeFinder(Protocol):
    async def candidates(
        self, view: ClusterView, asks: Sequence[ContainerAsk], exclude: Collection[NodeName] = ()
    ) -> list[Candidate]:
        """Nodes to try for this request, best first, none of ``exclude`` (the nodes that refused it
        already: the allocator asks again while it is refused and nodes are left)."""
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

    async def _held(self, owner: Owner) -> Allocation | None:
        """The owner's live allocation as the view knows it, confirmed by a fresh read. This
        answers a retry after the owner's record expired."""
        allocation_id = self.view.owned_by(owner)
        node = self.view.node_of(allocation_id) if allocation_id else None
        if allocation_id is None or node is None:
            return None
        ledger, _ = await self.store.read(node)
        found = ledger.get(allocation_id) if ledger else None
        return found if found is not None and found.held_at(self.clock()) else None

    async def _settle(
        self,
        owner: Owner,
        claimed: int | BaseException | None,
        reserved: Allocation | BaseException,
        claimed_node: NodeName,
        started: float,
    ) -> tuple[Allocation, bool] | None:
        """Reconcile the two concurrent writes: (allocation, existing), or None to try again."""
        if isinstance(claimed, BaseException):  # the index cannot be written: nothing may stay
            await self._undo(reserved)
            raise claimed
        if claimed is None:
            return await self._contest(owner, reserved)
        if isinstance(reserved, BaseException):
            await self.store.forget_owner(owner, claimed)
            raise reserved
        if reserved.node != claimed_node:  # the claim named the first node tried; correct it
            claimed = await self.store.claim_owner(owner, reserved.id, reserved.node, claimed, self.owner_ttl_s)
        elif time.monotonic() - started > self.absent_grace_s / 2:
            # A write this slow may have let another request judge our record abandoned.
            record = await self.store.owner_record(owner)
            claimed = record.revision if record is not None and record.allocation == reserved.id else None
        if claimed is None:  # our record was taken over: ours must not stay
            await self._undo(reserved)
            return None
        return reserved, False

    async def _contest(self, owner: Owner, reserved: Allocation | BaseException) -> tuple[Allocation, bool] | None:
        """Another record for the owner was in the way of ours: answer with its allocation if it
        is live; put ours in its place if it is stale; if its allocation is still being written,
        give our room back and wait for it. None: start over."""
        for _ in range(MAX_OWNER_ROUNDS):
            record = await self.store.owner_record(owner)
            found = await self._find_anywhere(record.allocation, record.node) if record is not None else None
            if found is not None and found.held_at(self.clock()):
                await self._undo(reserved)
                return found, True
            young = (
                record is not None
                and found is None
                and not self.view.left_its_node(record.allocation)  # written, released, pruned: stale
                and self.clock() - record.at <= self.absent_grace_s
            )
            if young:  # its writer is at work: hold nothing meanwhile (it may need the room)
                await self._undo(reserved)
                holder = await self._holder(owner, record)
                return None if holder is None else (holder, True)
            if isinstance(reserved, BaseException):
                raise reserved
            revision = record.revision if record is not None else 0
            taken = await self.store.claim_owner(owner, reserved.id, reserved.node, revision, self.owner_ttl_s)
            if taken is not None:
                return reserved, False
        await self._undo(reserved)
        return None

    async def _holder(self, owner: Owner, record: OwnerRecord | None) -> Allocation | None:
        """The live allocation the owner's record names, or None if the record is stale. An
        allocation not in the ledger yet may be on its way (its record and reservation are written
        at once): it is waited for, up to ``absent_grace_s`` after the record was written, unless
        this view saw it leave its node's key (released and pruned: written, and gone for good)."""
        while record is not None:
            found = await self._find_anywhere(record.allocation, record.node)
            if found is not None:
                return found if found.held_at(self.clock()) else None
            if self.view.left_its_node(record.allocation) or self.clock() - record.at > self.absent_grace_s:
                return None
            if time_left(self.store.retry_s) <= OWNER_POLL_S:  # the caller hears why before its deadline
                raise Unavailable(
                    f"{owner.describe()}: an earlier request of this owner is still being written "
                    f"({record.allocation} on {record.node})"
                )
            await asyncio.sleep(OWNER_POLL_S)
            record = await self.store.owner_record(owner)
        return None

    async def _find_anywhere(self, allocation_id: AllocationId, node: NodeName) -> Allocation | None:
        """The allocation as its node's key holds it now: on ``node``, or where the view saw it."""
        for where in dict.fromkeys((node, self.view.node_of(allocation_id))):
            if where:
                ledger, _ = await self.store.read(where)
                found = ledger.get(allocation_id) if ledger else None
                if found is not None:
                    return found
        return None

    async def _undo(self, reserved: Allocation | BaseException) -> None:
        if isinstance(reserved, Allocation):
            undo = _release_fn(reserved.node, reserved.id, self.clock(), "duplicate request")
            await self.store.mutate(reserved.node, undo)

    async def commit(self, allocation_id: AllocationId, node: NodeName | None = None) -> Allocation:
        with within(self.store.retry_s):
            return await self._commit(allocation_id, node)

    async def _commit(self, allocation_id: AllocationId, node: NodeName | None) -> Allocation:
        node = node or await self._node_of(allocation_id)
        written = await self.store.mutate(node, lambda ledger: commit(_must(ledger, node), allocation_id, self.clock()))
        return _find(written.new, allocation_id)

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
        written = await self.store.mutate(node, _release_fn(node, allocation_id, self.clock(), reason))
        released = _find(written.new, allocation_id)
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

    async def _forget(self, owner: Owner, allocation_id: AllocationId) -> None:
        try:
            await self.store.forget_owner_of(owner, allocation_id)
        except GpuledgerError as err:  # NATS away: the next bind or Allocate for this owner replaces it
            log.info("could not drop the owner record of %s yet: %s", owner.describe(), err)

    async def get(self, allocation_id: AllocationId) -> Allocation:
        with within(self.store.retry_s):
            node = await self._node_of(allocation_id)
            ledger, _ = await self.store.read(node)
            return _find(ledger, allocation_id)

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

    async def _nodes_for(self, call: AllocateCall) -> list[Candidate]:
        if call.node:
            if call.node not in self.view.ledgers and call.node not in self.view.unreadable:
                raise NotFound(f"node {call.node} is not in the ledger")
            return [Candidate(call.node)]
        return await self.finder.candidates(self.view, call.asks)

    async def _reserve_on(
        self, call: AllocateCall, nodes: Sequence[Candidate], allocation_id: AllocationId, lease_s: float
    ) -> Allocation:
        """Try the candidates in order; while every one refused, ask the finder for more (the nodes
        not tried yet), so no request is refused while a node can take it. A node that only lost
        its compare-and-set race (another writer got there first) is tried again at the end, with
        the store's full retries: the next candidate is tried meanwhile rather than waiting on it."""
        reasons: list[str] = [] if nodes else self._why_nowhere(call)
        tried: set[NodeName] = set()
        contended: list[Candidate] = []
        while nodes:
            for candidate in nodes:
                tried.add(candidate.node)
                found = await self._try_on(call, candidate, allocation_id, lease_s, reasons, contended)
                if found is not None:
                    return found
            nodes = [] if call.node else await self._more(call, tried)
        for candidate in contended:
            found = await self._try_on(call, candidate, allocation_id, lease_s, reasons, [], None)
            if found is not None:
                return found
        raise Exhausted(_no_fit(call, reasons))

    async def _more(self, call: AllocateCall, tried: set[NodeName]) -> list[Candidate]:
        more = await self.finder.candidates(self.view, call.asks, frozenset(tried))
        return [c for c in more if c.node not in tried]

    async def _try_on(
        self,
        call: AllocateCall,
        candidate: Candidate,
        allocation_id: AllocationId,
        lease_s: float,
        reasons: list[str],
        contended: list[Candidate],
        attempts: int | None = FIRST_PASS_ATTEMPTS,
    ) -> Allocation | None:
        """The reservation on the candidate, or None with the reason it refused noted (and, if it
        only lost ``attempts`` compare-and-set races, the candidate in ``contended``)."""
        node = candidate.node
        if self.view.unreadable and (unreadable := self.view.why_unreadable(node)) is not None:
            reasons.append(unreadable)
            return None
        if self.view.stale(node):
            reasons.append(f"{node}: stale (no heartbeat for {self.view.stale_after_s:g}s)")
            return None
        transition = self._fit_and_reserve(call, node, allocation_id, lease_s, candidate.cards)
        try:
            written = await self.store.mutate(node, transition, attempts)
        except Exhausted as err:
            reasons.append(str(err))
            return None
        except Conflict as err:
            reasons.append(str(err))
            contended.append(Candidate(node))
            return None
        return _find(written.new, allocation_id)

    def _why_nowhere(self, call: AllocateCall) -> list[str]:
        reasons: list[str] = []
        for ledger in self.view.ledgers.values():
            try:
                fit_node(ledger, call.asks, self.slots_per_card, self._tier(call))
            except Exhausted as err:
                reasons.append(str(err))
        reasons += [why for node in self.view.unreadable if (why := self.view.why_unreadable(node))]
        return reasons or ["the ledger has no nodes"]

    def _fit_and_reserve(
        self,
        call: AllocateCall,
        node: NodeName,
        allocation_id: AllocationId,
        lease_s: float,
        hint: tuple[tuple[int, ...], ...] | None = None,
    ) -> Callable[[NodeLedger | None], NodeLedger | None]:
        """Reserve on ``node``: the hinted cards if they still fit, else the built-in fit."""

        def build(grants: tuple[Grant, ...]) -> Allocation:
            requests = [a.request for a in call.asks]
            now = self.clock()
            return reservation(
                allocation_id, call.owner, node, grants, requests, isolation=call.isolation, now=now, lease_s=lease_s
            )

        def transition(ledger: NodeLedger | None) -> NodeLedger:
            current = _must(ledger, node)
            if current.get(allocation_id) is not None:
                return current  # an earlier try of this very write was applied, its answer lost
            hinted = _hinted(current, call.asks, hint)
            if hinted is not None:
                planned = build(hinted)
                if not slot_problem(current, planned, self.slots_per_card):
                    with contextlib.suppress(Exhausted):
                        return reserve(current, planned, mix_isolation=self.mix_isolation)
            grants = fit_node(current, call.asks, self.slots_per_card, self._tier(call))
            return reserve(current, build(grants), mix_isolation=self.mix_isolation)

        return transition

    def _tier(self, call: AllocateCall) -> Tier:
        return Tier(call.isolation, self.mix_isolation)

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


def _must(ledger: NodeLedger | None, node: str) -> NodeLedger:
    if ledger is None:
        raise NotFound(f"node {node} is not in the ledger")
    return ledger


def _find(ledger: NodeLedger | None, allocation_id: AllocationId) -> Allocation:
    found = ledger.get(allocation_id) if ledger else None
    if found is None:
        raise NotFound(f"allocation {allocation_id} does not exist (or was released long ago)")
    return found


def _release_fn(
    node: str, allocation_id: AllocationId, now: float, reason: str
) -> Callable[[NodeLedger | None], NodeLedger]:
    return lambda ledger: release(_must(ledger, node), allocation_id, now, reason)


def _hinted(
    ledger: NodeLedger, asks: Sequence[ContainerAsk], hint: tuple[tuple[int, ...], ...] | None
) -> tuple[Grant, ...] | None:
    """Grants on the hinted card indexes, or None when there is no usable hint."""
    if hint is None or len(hint) != len(asks):
        return None
    cards = {card.index: card for card in ledger.node.cards}
    grants = []
    for ask, indexes in zip(asks, hint, strict=True):
        if len(indexes) != ask.request.count or len(set(indexes)) != len(indexes):
            return None
        if any(i not in cards or not card_fits_model(cards[i], ask) for i in indexes):
            return None
        grants.append(Grant(ask.container, tuple(share_for(cards[i], ask.request) for i in indexes), ask.init))
    return tuple(grants)


def card_fits_model(card: Card, ask: ContainerAsk) -> bool:
    return card.healthy and ask.request.allows(card.model)


def _no_fit(call: AllocateCall, reasons: list[str]) -> str:
    what = call.owner.describe()
    shown = "; ".join(reasons[:MAX_REASONS])
    more = f" (and {len(reasons) - MAX_REASONS} more nodes)" if len(reasons) > MAX_REASONS else ""
    return f"{what} fits on no node: {shown}{more}"
