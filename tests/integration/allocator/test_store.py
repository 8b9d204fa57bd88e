"""The ledger store against a real nats-server: compare-and-set, and what a stale cache may do."""

from __future__ import annotations

import asyncio
from typing import Any

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


class _MarkerFirst:
    """A KV watcher whose client says the snapshot is over before it delivered anything (as the
    client's marker, and pending counts, did on a busy machine)."""

    def __init__(self, real: Any) -> None:
        self.real, self.marked = real, False

    def __aiter__(self) -> _MarkerFirst:
        return self

    async def __anext__(self) -> Any:
        if not self.marked:
            self.marked = True
            return None
        return await self.real.__anext__()

    async def stop(self) -> None:
        await self.real.stop()


class _EarlyMarkers:
    def __init__(self, kv: Any) -> None:
        self.kv = kv

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)

    async def watch(self, keys: str, **kwargs: Any) -> _MarkerFirst:
        return _MarkerFirst(await self.kv.watch(keys, **kwargs))


@pytest.mark.parametrize("early_marker", [False, True])
async def test_a_watch_snapshot_holds_every_key_while_writers_are_busy(nc: Client, early_marker: bool) -> None:
    """The snapshot of a watch ends only when every key the bucket held has arrived, however busy
    the bucket is and whatever the client says meanwhile (a replica's lookups and views start
    from it: a short one made a release answer NOT_FOUND for an allocation another replica made)."""
    store, writer = await LedgerStore.open(nc), await LedgerStore.open(nc)
    if early_marker:
        store.kv = _EarlyMarkers(store.kv)  # type: ignore[assignment]
    names = [NodeName(f"n{i:03d}") for i in range(150)]
    for name in names:
        await store.mutate(name, lambda _, n=name: NodeLedger(Node(n, (CARD,))))  # type: ignore[misc]
    stop = asyncio.Event()

    async def churn() -> None:  # rewrite a few keys as fast as the server takes them
        i = 0
        while not stop.is_set():
            name = names[i % 5]
            await writer.mutate(name, take(f"c-{i}", 16))
            await writer.mutate(name, lambda current, a=f"c-{i}": release(current, AllocationId(a), 0.0))  # type: ignore[misc]
            i += 1

    churning = [asyncio.create_task(churn()) for _ in range(3)]
    try:
        for _ in range(5):
            seen: set[str] = set()
            async for item in store.snapshot():
                seen.add(item[0])
            assert seen == set(names)
            assert set(await store.nodes()) == set(names)
    finally:
        stop.set()
        await asyncio.gather(*churning, return_exceptions=True)
