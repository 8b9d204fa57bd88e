"""Placement over NATS: the place and preferred subjects, and the allocator using placement."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.natsserver import NatsServer
from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Exhausted, InvalidArgument
from gpuledger_core.model import Node
from gpuledger_core.slots import device_id
from gpuledger_testing.stack import RunningAllocator, running_placement, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


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
