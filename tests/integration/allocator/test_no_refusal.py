"""No Allocate is refused while a node can take it, however many arrive at once.

Placement names only its few best nodes per answer; a burst of requests all get the same few, and
those fill up. The allocator then asks again for nodes it has not tried.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Exhausted
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_placement.service import RANKED
from tests.support.replicas import running_allocator, running_placement, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
NODES = 4 * RANKED  # one card each: a burst of NODES requests needs every node


async def allocate(nc: Client, tool: str) -> dict[str, Any]:
    body = {"owner": {"kind": "tool", "id": tool}, "containers": [{"container": "", "request": {"count": 1}}]}
    result = await bus.request(nc, "gpuledger.v1.allocator.allocate", body, timeout=30)
    allocation: dict[str, Any] = result["allocation"]
    return allocation


@pytest.mark.parametrize("with_placement", [True, False], ids=["placement", "built-in"])
async def test_a_burst_fills_every_node_and_only_then_is_refused(
    nats_server: NatsServer, nc: Client, with_placement: bool
) -> None:
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: n{i:02d}\n    profile: rtx3090-1\n" for i in range(NODES)))
    store = await LedgerStore.open(nc)
    async with running_allocator(nats_server.url):
        await announce(nc, [n.node for n in fleet.nodes])

        async def loaded() -> bool:
            return len(await store.nodes()) == NODES

        await wait_for(loaded, what="fleet in the ledger")
        async with running_placement(nats_server.url, policy="binpack") if with_placement else contextlib.nullcontext():
            granted = await asyncio.gather(*(allocate(nc, f"burst-{i}") for i in range(NODES)))
            assert sorted(a["node"] for a in granted) == sorted(n.node.name for n in fleet.nodes)
            with pytest.raises(Exhausted, match="fits on no node"):
                await allocate(nc, "one-too-many")
