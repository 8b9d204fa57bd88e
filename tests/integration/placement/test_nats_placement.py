"""Placement over NATS: the place and preferred subjects, and the allocator using placement."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from nats.aio.client import Client
from prometheus_client import REGISTRY

from gpuledger_allocator.finder import BuiltinFinder, PlacementFinder
from gpuledger_allocator.reserving import Candidate
from gpuledger_allocator.view import ClusterView
from gpuledger_common import bus
from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Exhausted, InvalidArgument
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ledger import NodeLedger, release
from gpuledger_core.model import Node, Request
from gpuledger_core.slots import device_id
from gpuledger_dev.natsserver import NatsServer
from tests.support.replicas import RunningAllocator, running_placement, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
ONE_CARD = (ContainerAsk("", Request(count=1)),)


def containers(count: int, **request: Any) -> list[dict[str, Any]]:
    return [{"container": "", "request": {"count": count, **request}}]


async def allocate(nc: Client, tool: str, count: int) -> dict[str, Any]:
    body = {"owner": {"kind": "tool", "id": tool}, "containers": containers(count)}
    result = await bus.request(nc, "gpuledger.v1.allocator.allocate", body)
    allocation: dict[str, Any] = result["allocation"]
    return allocation


async def node_of(nc: Client, name: str) -> Node:
    ledger, _ = await (await LedgerStore.open(nc)).read(name)
    assert ledger is not None
    return ledger.node


async def test_place_answers_node_cards_and_a_ranking(
    nats_server: NatsServer, nc: Client, allocator: RunningAllocator
) -> None:
    async with running_placement(nats_server.url, policy="binpack"):
        result = await bus.request(nc, "gpuledger.v1.placement.place", {"containers": containers(2, mem_mib=4000)})
        assert result["node"] == "p4-0"  # binpack: the node with the least room left after
        assert result["containers"] == [{"container": "", "init": False, "cards": [0, 1]}]
        assert result["ranked"] == ["p4-0", "h100-0"]

        with pytest.raises(Exhausted, match=r"fits on no node: .*h100-0: .*the pod needs 100000 MiB"):
            await bus.request(nc, "gpuledger.v1.placement.place", {"containers": containers(1, mem_mib=100000)})
        with pytest.raises(InvalidArgument, match="containers"):
            await bus.request(nc, "gpuledger.v1.placement.place", {"containers": []})


async def test_preferred_answers_the_best_connected_offered_cards(
    nats_server: NatsServer, nc: Client, allocator: RunningAllocator
) -> None:
    node = await node_of(nc, "h100-0")
    offered = [device_id(c.uuid, slot) for c in node.cards for slot in (0, 1)]
    async with running_placement(nats_server.url):
        body = {"node": "h100-0", "available": offered, "must_include": [], "size": 4}
        result = await bus.request(nc, "gpuledger.v1.placement.preferred", body)
        ids = result["device_ids"]
        assert len(ids) == 4
        assert len({i.rpartition("::")[0] for i in ids}) == 4  # four distinct cards
        assert all(i.endswith("::0") for i in ids)  # the lowest offered slot of each
        by_uuid = {c.uuid: c for c in node.cards}
        assert {by_uuid[i.rpartition("::")[0]].numa for i in ids} == {0}  # one NUMA node, not split


async def test_the_allocator_uses_placement_when_it_is_up_and_fits_alone_when_not(
    nats_server: NatsServer, nc: Client, allocator: RunningAllocator
) -> None:
    alone = await allocate(nc, "before", 1)
    assert alone["node"] == "h100-0"  # the built-in order: fullest first, then by name

    async with running_placement(nats_server.url, policy="binpack"):
        placed = await allocate(nc, "with-placement", 1)
        assert placed["node"] == "rtx-0"  # binpack sends a single card to the one-card node

    await asyncio.sleep(1.1)  # placement's last answer, asked ahead, is too old to take (placement_ahead_s)
    after = await allocate(nc, "after", 1)
    assert after["node"] == "h100-0"


async def test_a_restarted_placement_counts_the_ledger_as_its_workload(
    nats_server: NatsServer, nc: Client, allocator: RunningAllocator, caplog: pytest.LogCaptureFixture
) -> None:
    for n, cards in enumerate((1, 2)):
        await allocate(nc, f"running-{n}", cards)
    released = await allocate(nc, "finished", 1)
    await bus.request(nc, "gpuledger.v1.allocator.release", {"allocation_id": released["id"]})
    caplog.set_level("INFO", logger="gpuledger_placement.app")
    async with running_placement(nats_server.url):

        async def seeded() -> str | None:
            found = [r.getMessage() for r in caplog.records if "workload seeded" in r.getMessage()]
            return found[0] if found else None

        message = await wait_for(seeded, what="the workload seeded")
        assert message == "workload seeded from the ledger: 2 live allocation(s)"


async def _candidates(finder: PlacementFinder, view: ClusterView) -> list[Candidate]:
    """The finder's candidates, as the allocator asks while it answers a request."""
    with bus.answering() as replied:
        found = await finder.candidates(view, ONE_CARD)
        replied()
    return found


async def test_an_answer_asked_ahead_is_taken_only_while_the_ledger_is_unchanged_and_it_is_young(
    nats_server: NatsServer, nc: Client, allocator: RunningAllocator
) -> None:
    view = ClusterView(await LedgerStore.open(nc))
    watching = asyncio.create_task(view.run())
    await view.ready.wait()
    finder = PlacementFinder(nc, timeout_s=5.0, retry_s=0.0, fallback=BuiltinFinder())
    try:
        async with running_placement(nats_server.url, policy="binpack"):
            await _candidates(finder, view)  # asked during the request; the next answer is asked after it
            await finder.settle()
            assert (finder.answered, finder.taken_ahead) == (1, 0)
            direct = await bus.request(nc, "gpuledger.v1.placement.place", {"containers": containers(1)})
            assert direct["revision"] == view.revisions[direct["node"]]  # the revision placement judged

            taken = await _candidates(finder, view)  # nothing changed: no hop to placement
            assert (finder.answered, finder.taken_ahead) == (1, 1)
            assert taken[0] == Candidate(direct["node"], tuple(tuple(c["cards"]) for c in direct["containers"]))
            assert [c.node for c in taken] == direct["ranked"]

            # A change anywhere in the ledger (here on another node than the one named) voids it.
            await finder.settle()
            applied = view.applied
            other = await allocate(nc, "elsewhere", 2)
            assert other["node"] != direct["node"]

            async def seen() -> bool:
                return view.applied > applied

            await wait_for(seen, what="the change in the view")
            await _candidates(finder, view)
            assert (finder.answered, finder.taken_ahead) == (2, 1)

            # So does a write of this process, even before its view hears of it.
            await finder.settle()

            def released(ledger: NodeLedger | None) -> NodeLedger:
                assert ledger is not None
                return release(ledger, other["id"], time.time())

            await view.store.mutate(other["node"], released)
            await _candidates(finder, view)
            assert (finder.answered, finder.taken_ahead) == (3, 1)

            # An answer older than ahead_s is not taken either.
            await finder.settle()
            finder.ahead_s = 0.05
            await asyncio.sleep(0.1)
            await _candidates(finder, view)
            assert (finder.answered, finder.taken_ahead) == (4, 1)
            finder.ahead_s = 0.0  # and with 0 nothing is asked ahead: every request asks placement
            await finder.settle()
            for asked in (5, 6):
                await _candidates(finder, view)
                assert (finder.answered, finder.taken_ahead) == (asked, 1)
    finally:
        await finder.stop()
        watching.cancel()


async def test_the_allocator_takes_answers_asked_ahead_between_requests(
    nats_server: NatsServer, nc: Client, allocator: RunningAllocator
) -> None:
    def counted(source: str) -> float:
        return REGISTRY.get_sample_value("gpuledger_allocator_placement_answers_total", {"source": source}) or 0.0

    before = {source: counted(source) for source in ("asked", "ahead")}
    async with running_placement(nats_server.url, policy="binpack"):
        for n in range(4):
            best = await bus.request(nc, "gpuledger.v1.placement.place", {"containers": containers(1)})
            assert (await allocate(nc, f"in-turn-{n}", 1))["node"] == best["node"]  # wherever the answer came from
            await asyncio.sleep(0.3)  # time for the next answer to come
    assert counted("asked") - before["asked"] >= 1  # the first at least
    assert counted("ahead") - before["ahead"] >= 1
    assert counted("asked") + counted("ahead") - sum(before.values()) == 4
