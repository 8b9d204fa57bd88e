"""How an Allocate reserves: the call (``AllocateCall``), the nodes a finder names for it
(``Candidate``, ``NodeFinder``), tried in order until one takes it (``NodeTrials``), and the
transitions written on a node's key: the reservation (the hinted cards if they still fit, else the
built-in fit), and the release of one that must not stay.

A node that only lost its compare-and-set race is tried again at the end; while every node refused,
the finder is asked for the nodes not tried yet, so no request is refused while a node can take it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuledger_allocator.view import ClusterView
from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Conflict, Exhausted, InvalidArgument, NotFound
from gpuledger_core.fit import ContainerAsk, Tier, fit_node, share_for
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, release, reservation, reserve
from gpuledger_core.model import Allocation, Card, Grant, Isolation, Owner
from gpuledger_core.slots import slot_problem

MAX_REASONS = 5
FIRST_PASS_ATTEMPTS = 1  # a node whose race this request lost is left for the end: others are tried first


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


class NodeTrials:
    """The allocator's trial of nodes for an Allocate, over the service's state."""

    __slots__ = ()
    store: LedgerStore
    view: ClusterView
    finder: NodeFinder
    clock: Callable[[], float]
    slots_per_card: int
    mix_isolation: bool

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
        return find(written.new, allocation_id)

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
            current = must(ledger, node)
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


def must(ledger: NodeLedger | None, node: str) -> NodeLedger:
    if ledger is None:
        raise NotFound(f"node {node} is not in the ledger")
    return ledger


def find(ledger: NodeLedger | None, allocation_id: AllocationId) -> Allocation:
    found = ledger.get(allocation_id) if ledger else None
    if found is None:
        raise NotFound(f"allocation {allocation_id} does not exist (or was released long ago)")
    return found


def release_fn(
    node: str, allocation_id: AllocationId, now: float, reason: str
) -> Callable[[NodeLedger | None], NodeLedger]:
    return lambda ledger: release(must(ledger, node), allocation_id, now, reason)


def _hinted(
    ledger: NodeLedger, asks: Sequence[ContainerAsk], hint: tuple[tuple[int, ...], ...] | None
) -> tuple[Grant, ...] | None:
    """Grants on the hinted card indexes, or None when there is no usable hint (a MIG ask's is
    never: a hint names cards, not placements, so its instances are fitted again)."""
    if hint is None or len(hint) != len(asks) or any(ask.request.mig for ask in asks):
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
