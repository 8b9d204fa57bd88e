"""Which nodes (and cards) the allocator tries for a request.

``PlacementFinder`` asks the placement service (``gpuledger.v1.placement.place``) for its topology- and
fragmentation-aware choice, and falls back to ``BuiltinFinder`` when nobody answers in time. The
built-in order packs: nodes whose cards fit (room and a free slot), fullest first, so that whole free
cards stay whole.

Placement's answer is asked ahead: once a request is answered, placement's answer for the next
request of the same shape is asked in the background, and that request takes it without a hop to
placement if nothing in this replica's view of the ledger changed since the answer came and it is
younger than ``ahead_s`` (services/gpuledger_placement/README.md, "Answers asked ahead").
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client

from gpuledger_allocator.metrics import PLACEMENT_ANSWERS
from gpuledger_allocator.reserving import Candidate, NodeFinder
from gpuledger_allocator.view import ClusterView
from gpuledger_common import bus
from gpuledger_core import codec
from gpuledger_core.errors import Exhausted, GpuledgerError, Unavailable
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Grant, Isolation, Node
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD
from gpuledger_core.usage import free_mem

log = logging.getLogger(__name__)
PLACE_SUBJECT = f"{bus.SUBJECT_PREFIX}.placement.place"
ABSENT_RETRY_S = 2.0  # default: how long the allocator fits alone after placement did not answer
Cards = tuple[tuple[int, ...], ...]  # card indexes per container
Judged = tuple[float, Cards]
Holds = tuple[Node, tuple[tuple[tuple[Grant, ...], Isolation], ...]]  # what a verdict reads (``_holds``)
JUDGED_KEPT = 5_000  # distinct requests remembered
WON_ELSEWHERE_S = 0.02  # a node another replica wrote this lately goes after the others
AHEAD_S = 1.0  # default: the oldest answer asked ahead that a request takes
AHEAD_KEPT = 256  # shapes of request with an answer asked ahead
CATCH_UP_S = 0.05  # how long an answer asked ahead waits for this view to catch up with it
Shape = tuple[ContainerAsk, ...]


def _judge(ledger: NodeLedger, asks: Sequence[ContainerAsk], slots_per_card: int) -> Judged | None:
    """The node's free share and the cards the built-in fit picks there, or None if it does not fit."""
    try:
        grants = fit_node(ledger, asks, slots_per_card)
    except Exhausted:
        return None
    return _free_share(ledger), tuple(tuple(share.index for share in grant.cards) for grant in grants)


def _holds(ledger: NodeLedger) -> Holds:
    """What ``_judge`` reads of a ledger: the node, and each live allocation's grants and isolation
    tier. A node whose value changed without changing these (a commit, a reservation and its
    release) keeps its verdict. The store reuses unchanged parts when it decodes a value, so two
    of these are mostly compared by identity."""
    return ledger.node, tuple((a.grants, a.isolation) for a in ledger.allocations if a.live)


def _free_share(ledger: NodeLedger) -> float:
    use = ledger.use()
    total = free = 0
    for card in ledger.node.cards:
        total += card.memory_mib
        free += free_mem(card, use.get(card.uuid))
    return free / (total or 1)


class BuiltinFinder:
    def __init__(self, slots_per_card: int = DEFAULT_SLOTS_PER_CARD, won_elsewhere_s: float = WON_ELSEWHERE_S) -> None:
        self.slots_per_card = slots_per_card
        self.won_elsewhere_s = won_elsewhere_s  # how recent another replica's write must be to rank a node later
        # asks -> node -> (revision, free share and cards if the asks fit, else None, what the
        # verdict read): a node is judged again only when what it holds changed or the request is new.
        self._judged: dict[tuple[ContainerAsk, ...], dict[NodeName, tuple[int, Judged | None, Holds]]] = {}
        self.judgements = 0  # verdicts worked out (the rest were the ones before, still true)

    async def candidates(
        self, view: ClusterView, asks: Sequence[ContainerAsk], exclude: Collection[NodeName] = ()
    ) -> list[Candidate]:
        """Nodes where the asks fit, fullest first, each with the cards the fit picked there (the
        reservation takes those if the node is unchanged, and fits again if not)."""
        fitting: list[tuple[bool, bool, float, NodeName, Cards]] = []
        if len(self._judged) > JUDGED_KEPT:
            self._judged.clear()
        judged = self._judged.setdefault(tuple(asks), {})
        crowded = view.store.crowded()
        elsewhere = view.store.won_elsewhere(self.won_elsewhere_s)
        revisions = view.revisions
        for name, ledger in view.ledgers.items():
            if name in exclude:
                continue
            revision = revisions.get(name, 0)
            seen = judged.get(name)
            if seen is None or seen[0] != revision:
                holds = _holds(ledger)
                if seen is not None and seen[2] == holds:  # tuples compare parts that are the same object at once
                    seen = judged[name] = (revision, seen[1], holds)
                else:
                    self.judgements += 1
                    seen = judged[name] = (revision, _judge(ledger, asks, self.slots_per_card), holds)
            verdict = seen[1]
            if verdict is not None:
                fitting.append((name in crowded, name in elsewhere, verdict[0], name, verdict[1]))
        # Fullest first; a node this process is writing right now, or lost a race on lately, goes
        # after the others, and so, next, does one another replica has just written: concurrent
        # requests (of this replica, and of replicas beside it) spread instead of queueing on one
        # key (docs/ledger.md, "Several replicas"). Names are unique: the cards never decide.
        fitting.sort()
        return [Candidate(f[3], f[4]) for f in fitting]


@dataclass(frozen=True, slots=True)
class _Ahead:
    """Placement's answer asked ahead: its candidates, when it came, the view's count of changes
    applied then, and this process's count of ledger writes when it was asked."""

    candidates: list[Candidate]
    at: float
    applied: int
    writes: int


class PlacementFinder:
    """The placement service's choice, or the fallback's when placement does not answer."""

    def __init__(
        self,
        nc: Client,
        timeout_s: float,
        retry_s: float = ABSENT_RETRY_S,
        fallback: NodeFinder | None = None,
        ahead_s: float = AHEAD_S,
    ) -> None:
        self.nc, self.timeout_s, self.retry_s, self.ahead_s = nc, timeout_s, retry_s, ahead_s
        self.fallback = fallback or BuiltinFinder()
        self.answered = self.fell_back = self.taken_ahead = 0
        self._counted = {s: PLACEMENT_ANSWERS.labels(s) for s in ("asked", "ahead", "builtin")}
        self._absent_until = 0.0  # after placement failed to answer, fit alone for a while
        self._ahead: dict[Shape, _Ahead] = {}
        self._asking: dict[Shape, int] = {}  # shape -> this process's ledger writes when its answer was last asked
        self._tasks: set[asyncio.Task[None]] = set()

    async def candidates(
        self, view: ClusterView, asks: Sequence[ContainerAsk], exclude: Collection[NodeName] = ()
    ) -> list[Candidate]:
        """Placement's choice and ranking (at most its ``RANKED`` best nodes) among the nodes not in
        ``exclude``."""
        now = time.monotonic()
        if now < self._absent_until:
            return await self._fall_back(view, asks, exclude)
        shape = tuple(asks)
        if not exclude and self.ahead_s > 0:
            ahead = self._ahead.pop(shape, None)
            # Asked once this request has its answer: by then placement has the change it made.
            bus.after_reply(lambda: self._ask_ahead(view, shape))
            if ahead is not None and now - ahead.at <= self.ahead_s and _unchanged(view, ahead):
                self.taken_ahead += 1
                self._counted["ahead"].inc()
                return ahead.candidates
        try:
            result = await bus.request(self.nc, PLACE_SUBJECT, _body(shape, exclude), self.timeout_s)
        except Exhausted:  # placement knows nothing fits; the allocator says why in its own words
            self._asked()
            return []
        except GpuledgerError as err:
            log.debug("placement did not answer (%s); choosing nodes without it", err)
            if isinstance(err, Unavailable):
                self._absent_until = now + self.retry_s
            return await self._fall_back(view, asks, exclude)
        self._asked()
        return _candidates_from(result, len(asks))

    def _asked(self) -> None:
        self.answered += 1
        self._counted["asked"].inc()

    async def _fall_back(
        self, view: ClusterView, asks: Sequence[ContainerAsk], exclude: Collection[NodeName]
    ) -> list[Candidate]:
        self.fell_back += 1
        self._counted["builtin"].inc()
        return await self.fallback.candidates(view, asks, exclude)

    def _ask_ahead(self, view: ClusterView, shape: Shape) -> None:
        """Ask placement's answer for the next request of ``shape``, unless it is being asked
        already with no write of this process since (an answer asked before a write is not taken)."""
        writes = view.store.stats.writes
        if self._asking.get(shape) == writes:
            return
        self._asking[shape] = writes
        asked = self._asked_ahead(view, shape, writes, view.store.written_up_to)  # in a context of its own
        task = asyncio.get_running_loop().create_task(asked, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _asked_ahead(self, view: ClusterView, shape: Shape, writes: int, written_up_to: int) -> None:
        """Keep placement's next answer for ``shape`` if the node it names is, in this replica's
        view, at the revision placement judged, once the view has this process's writes too.
        Nothing is kept when the answer names no revision (pods the scheduler assumed on the node
        count there too, or an older placement) or does not come (the next request asks
        placement, and falls back as it would)."""
        try:
            result = await bus.request(self.nc, PLACE_SUBJECT, _body(shape, ()), self.timeout_s)
        except GpuledgerError as err:
            log.debug("placement's answer asked ahead did not come (%s)", err)
            return
        finally:
            if self._asking.get(shape) == writes:
                del self._asking[shape]
        revision = result.get("revision") if isinstance(result, dict) else None
        candidates = _candidates_from(result, len(shape))
        if not isinstance(revision, int) or revision <= 0 or not candidates:
            return
        # The view may not have heard yet of the writes placement judged, this process's own
        # among them: the watch brings the bucket's changes in order, so wait for the latest.
        node, until, caught_up = candidates[0].node, time.monotonic() + CATCH_UP_S, max(revision, written_up_to)
        while view.latest < caught_up and (left := until - time.monotonic()) > 0:
            await view.changed(left)
        kept = self._ahead.get(shape)
        if view.revisions.get(node) != revision or (kept is not None and kept.writes > writes):
            return
        if len(self._ahead) >= AHEAD_KEPT:
            self._ahead.clear()
        self._ahead[shape] = _Ahead(candidates, time.monotonic(), view.applied, writes)

    async def settle(self) -> None:
        """Wait for the answers being asked ahead."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel the answers still being asked ahead."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _unchanged(view: ClusterView, ahead: _Ahead) -> bool:
    """Nothing changed in the ledger since the answer asked ahead: this view applied no change
    after it came, and this process wrote none after asking it (its own writes reach the view
    through the watch, a moment later)."""
    return view.applied == ahead.applied and view.store.stats.writes == ahead.writes


def _body(shape: Shape, exclude: Collection[NodeName]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "containers": [
            {"container": a.container, "request": codec.request_to(a.request), "init": a.init} for a in shape
        ]
    }
    if exclude:
        body["exclude"] = sorted(exclude)
    return body


def _candidates_from(result: Any, containers: int) -> list[Candidate]:
    if not isinstance(result, dict) or not isinstance(result.get("node"), str):
        return []
    cards = tuple(tuple(c.get("cards", ())) for c in result.get("containers", ()) if isinstance(c, dict))
    first = Candidate(NodeName(result["node"]), cards if len(cards) == containers else None)
    ranked = [n for n in result.get("ranked", ()) if isinstance(n, str) and n != first.node]
    return [first, *(Candidate(NodeName(n)) for n in ranked)]
