"""Isolation tiers through the real services (a real nats-server and ledger): an mps tenant and a
none tenant never share a card, whether the allocator or placement's extender places them, unless
the services' ``mix_isolation`` allows it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Exhausted
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.usage import node_use
from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.natsserver import NatsServer
from tests.support.replicas import RunningAllocator, RunningPlacement, running_allocator, wait_for

from .helpers import args, bind_args, gpu_pod, post

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
ALLOCATE = "gpuledger.v1.allocator.allocate"


def tool(owner: str, isolation: str, node: str = "", mem: int = 1000) -> dict[str, Any]:
    return {
        "owner": {"kind": "tool", "id": owner},
        "containers": [{"container": "", "request": {"count": 1, "mem_mib": mem, "core_milli": 100}}],
        "isolation": isolation,
        "commit": True,
        "node": node,
    }


async def tiers_per_card(nc: Client, node: str) -> list[set[str]]:
    ledger, _ = await (await LedgerStore.open(nc)).read(node)
    assert isinstance(ledger, NodeLedger)
    return [{t.value for t in use.tiers} for use in node_use(ledger.allocations).values()]


async def test_the_allocator_keeps_an_mps_card_from_a_none_tenant(allocator: RunningAllocator, nc: Client) -> None:
    first = await bus.request(nc, ALLOCATE, tool("mps-a", "mps", "rtx-0"))
    assert first["allocation"]["node"] == "rtx-0"
    with pytest.raises(Exhausted, match="isolation none does not share a card with mps tenants"):
        await bus.request(nc, ALLOCATE, tool("none-b", "none", "rtx-0"))
    same = await bus.request(nc, ALLOCATE, tool("mps-c", "mps", "rtx-0"))  # its own tier joins
    assert same["allocation"]["node"] == "rtx-0"
    # Free to go anywhere, the none tenant goes elsewhere, though rtx-0's card has the room.
    elsewhere = await bus.request(nc, ALLOCATE, tool("none-d", "none"))
    assert elsewhere["allocation"]["node"] != "rtx-0"
    assert await tiers_per_card(nc, "rtx-0") == [{"mps"}]


@pytest.fixture
async def mixing(nats_server: NatsServer, nc: Client, fleet: Fleet) -> AsyncIterator[RunningAllocator]:
    async with running_allocator(nats_server.url, mix_isolation=True) as running:
        await announce(nc, [n.node for n in fleet.nodes])

        async def announced() -> bool:
            store = await LedgerStore.open(nc)
            ledger, _ = await store.read("rtx-0")
            return ledger is not None

        await wait_for(announced, what="rtx-0 in the ledger")
        yield running


async def test_with_mix_isolation_the_allocator_lets_the_tiers_share(mixing: RunningAllocator, nc: Client) -> None:
    await bus.request(nc, ALLOCATE, tool("mps-a", "mps", "rtx-0"))
    await bus.request(nc, ALLOCATE, tool("none-b", "none", "rtx-0"))
    assert await tiers_per_card(nc, "rtx-0") == [{"mps", "none"}]


async def test_the_extender_filters_and_binds_by_tier(
    placement: RunningPlacement, apiserver: FakeApiServer, nc: Client, http: aiohttp.ClientSession
) -> None:
    mps = {"gpuledger.io/isolation": "mps"}
    apiserver.add_pod(gpu_pod("mps-a", gpu=1, mem=1000, annotations=mps))
    assert await post(http, f"{placement.url}/bind", bind_args("mps-a", "rtx-0")) == (200, {"Error": ""})

    async def refused() -> str | None:
        _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("none-b", gpu=1, mem=1000), ["rtx-0"]))
        found: str | None = body["FailedNodes"].get("rtx-0")
        return found

    why = await wait_for(refused, what="the mps bind in placement's view")
    assert "held by another isolation tier (isolation none does not share a card with mps tenants" in why
    joining = gpu_pod("mps-c", gpu=1, mem=1000, annotations=mps)
    _, body = await post(http, f"{placement.url}/filter", args(joining, ["rtx-0"]))
    assert body["NodeNames"] == ["rtx-0"]

    # A bind the scheduler sends anyway (a stale filter) is refused: the ledger's own check.
    apiserver.add_pod(gpu_pod("none-b", gpu=1, mem=1000))
    status, body = await post(http, f"{placement.url}/bind", bind_args("none-b", "rtx-0"))
    assert status == 200 and "isolation none does not share a card with mps tenants" in body["Error"]
    assert apiserver.pod("default", "none-b")["spec"].get("nodeName") is None

    # On a node with room on other cards, the none pod gets a card of its own.
    apiserver.add_pod(gpu_pod("mps-h", gpu=1, mem=1000, annotations=mps))
    apiserver.add_pod(gpu_pod("none-h", gpu=1, mem=1000))
    for name in ("mps-h", "none-h"):
        assert await post(http, f"{placement.url}/bind", bind_args(name, "h100-0")) == (200, {"Error": ""})
    assert sorted(map(sorted, await tiers_per_card(nc, "h100-0"))) == [["mps"], ["none"]]
    assert await tiers_per_card(nc, "rtx-0") == [{"mps"}]
