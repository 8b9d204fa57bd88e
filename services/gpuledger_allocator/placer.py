"""Which nodes (and cards) the allocator tries for a request.

``NatsPlacer`` asks the placement service (``gpuledger.v1.placement.place``) for its topology- and
fragmentation-aware choice, and falls back to ``BuiltinPlacer`` when nobody answers in time. The
built-in order packs: nodes whose cards fit (room and a free slot), fullest first, so that whole free
cards stay whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

from nats.aio.client import Client

from gpuledger_allocator.service import Candidate, Placer
from gpuledger_allocator.view import ClusterView
from gpuledger_common import bus
from gpuledger_core import codec
from gpuledger_core.errors import Exhausted, GpuledgerError, Unavailable
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD
from gpuledger_core.usage import free_mem

log = logging.getLogger(__name__)
PLACE_SUBJECT = f"{bus.SUBJECT_PREFIX}.placement.place"
ABSENT_RETRY_S = 2.0  # default: how long the allocator fits alone after placement did not answer
Cards = tuple[tuple[int, ...], ...]  # card indexes per container
Judged = tuple[float, Cards]
JUDGED_KEPT = 5_000
WON_ELSEWHERE_S = 0.02  # a node another replica wrote this lately goes after the others  # distinct requests remembered


def _judge(ledger: NodeLedger, asks: Sequence[ContainerAsk], slots_per_card: int) -> Judged | None:
    """The node's free share and the cards the built-in fit picks there, or None if it does not fit."""
    try:
        grants = fit_node(ledger, asks, slots_per_card)
    except Exhausted:
        return None
    return _free_share(ledger), tuple(tuple(share.index for share in grant.cards) for grant in grants)


def _free_share(ledger: NodeLedger) -> float:
    use = ledger.use()
    total = free = 0
    for card in ledger.node.cards:
        total += card.memory_mib
        free += free_mem(card, use.get(card.uuid))
    return free / (total or 1)


class BuiltinPlacer:
    def __init__(self, slots_per_card: int = DEFAULT_SLOTS_PER_CARD, won_elsewhere_s: float = WON_ELSEWHERE_S) -> None:
        self.slots_per_card = slots_per_card
        self.won_elsewhere_s = won_elsewhere_s  # how recent another replica's write must be to rank a node later
        # asks -> node -> (revision, free share if the asks fit, else None): a node is judged
        # again only when its ledger changed or the request is new.
        self._judged: dict[tuple[ContainerAsk, ...], dict[NodeName, tuple[int, Judged | None]]] = {}

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
                seen = judged[name] = (revision, _judge(ledger, asks, self.slots_per_card))
            verdict = seen[1]
            if verdict is not None:
                fitting.append((name in crowded, name in elsewhere, verdict[0], name, verdict[1]))
        # Fullest first; a node this process is writing right now, or lost a race on lately, goes
        # after the others, and so, next, does one another replica has just written: concurrent
        # requests (of this replica, and of replicas beside it) spread instead of queueing on one
        # key (docs/ledger.md, "Several replicas"). Names are unique: the cards never decide.
        fitting.sort()
        return [Candidate(f[3], f[4]) for f in fitting]


class NatsPlacer:
    """The placement service's choice, or the fallback's when placement does not answer."""

    def __init__(
        self, nc: Client, timeout_s: float, retry_s: float = ABSENT_RETRY_S, fallback: Placer | None = None
    ) -> None:
        self.nc, self.timeout_s, self.retry_s = nc, timeout_s, retry_s
        self.fallback = fallback or BuiltinPlacer()
        self.answered = self.fell_back = 0
        self._absent_until = 0.0  # after placement failed to answer, fit alone for a while

    async def candidates(
        self, view: ClusterView, asks: Sequence[ContainerAsk], exclude: Collection[NodeName] = ()
    ) -> list[Candidate]:
        """Placement's choice and ranking (at most its ``RANKED`` best nodes) among the nodes not in
        ``exclude``."""
        now = time.monotonic()
        if now < self._absent_until:
            self.fell_back += 1
            return await self.fallback.candidates(view, asks, exclude)
        body: dict[str, Any] = {
            "containers": [
                {"container": a.container, "request": codec.request_to(a.request), "init": a.init} for a in asks
            ]
        }
        if exclude:
            body["exclude"] = sorted(exclude)
        try:
            result = await bus.request(self.nc, PLACE_SUBJECT, body, self.timeout_s)
        except Exhausted:  # placement knows nothing fits; the allocator says why in its own words
            self.answered += 1
            return []
        except GpuledgerError as err:
            log.debug("placement did not answer (%s); choosing nodes without it", err)
            if isinstance(err, Unavailable):
                self._absent_until = now + self.retry_s
            self.fell_back += 1
            return await self.fallback.candidates(view, asks, exclude)
        self.answered += 1
        return _candidates_from(result, len(asks))


def _candidates_from(result: Any, containers: int) -> list[Candidate]:
    if not isinstance(result, dict) or not isinstance(result.get("node"), str):
        return []
    cards = tuple(tuple(c.get("cards", ())) for c in result.get("containers", ()) if isinstance(c, dict))
    first = Candidate(NodeName(result["node"]), cards if len(cards) == containers else None)
    ranked = [n for n in result.get("ranked", ()) if isinstance(n, str) and n != first.node]
    return [first, *(Candidate(NodeName(n)) for n in ranked)]
