"""The ledger store against a real nats-server: compare-and-set, and what a stale cache may do."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client

from gpuledger_common.store import LedgerStore, Transition
from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, release, reserve
from gpuledger_core.model import Allocation, Card, Node, Owner, OwnerKind, Request

NODE = NodeName("n1")
CARD = Card(CardUuid("GPU-1"), 0, "Tesla P4", 7611)


def ledger() -> NodeLedger:
    return NodeLedger(Node(NODE, (CARD,)))


def take(allocation_id: str, mem: int) -> Transition:
    def transition(current: NodeLedger | None) -> NodeLedger:
        assert current is not None
        grants = fit_node(current, [ContainerAsk("", Request(mem_mib=mem))])
        owner = Owner(OwnerKind.TOOL, allocation_id)
        return reserve(current, Allocation(AllocationId(allocation_id), owner, NODE, grants))

    return transition


async def test_a_stale_cache_never_turns_into_a_wrong_answer(nc: Client) -> None:
    a, b = await LedgerStore.open(nc), await LedgerStore.open(nc)
    await a.mutate(NODE, lambda _: ledger())
    await b.read(NODE)  # b now knows the empty node: soon stale
    await a.mutate(NODE, take("x", 7000))  # a fills the card; b has not seen it

    # b releases what it has not seen yet: its cached value says "no such allocation"; a fresh
    # read finds it, and the release goes through.
    written = await b.mutate(NODE, lambda cur: release(ledger() if cur is None else cur, AllocationId("x"), 1.0))
    gone = written.new.get(AllocationId("x")) if written.new else None
    assert gone is not None and not gone.live

    # b's cache now holds the release; a's is stale and says the card is full: a fresh read
    # shows room, so a's reservation succeeds instead of being refused.
    await a.mutate(NODE, take("y", 7000))

    # and a real refusal still comes back as one
    with pytest.raises(Exhausted, match="short of 7000 MiB"):
        await b.mutate(NODE, take("z", 7000))


async def test_concurrent_writers_never_overfill_a_card(nc: Client) -> None:
    stores = [await LedgerStore.open(nc) for _ in range(3)]
    await stores[0].mutate(NODE, lambda _: ledger())

    async def one(i: int) -> bool:
        try:
            await stores[i % 3].mutate(NODE, take(f"t{i}", 1000))
        except Exhausted:
            return False
        return True

    granted = sum(await asyncio.gather(*(one(i) for i in range(12))))
    final, _ = await stores[0].read(NODE)
    assert final is not None
    assert granted == 7 == len(final.live())  # 7 x 1000 MiB fit in 7611 MiB, never 8
    assert sum(s.stats.conflicts for s in stores) > 0  # the writers did race
