"""Each service does its work with its own NATS user and nothing more: the allocator and
placement as themselves, each node's inventory and plugin as that node's users, the operator's
``gpuledger health``, over TLS; a reader may see ``gpuledger health``'s report, and the dashboard
a card's history (the allocator asks the inventory); the only permission violation is the
reader's attempt to set a card's health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client

from gpuledger_cli.health import cluster_reports, node_report
from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.inventory_api import set_card_health
from gpuledger_common.natsauth import Role
from gpuledger_common.store import LedgerStore
from gpuledger_core.errors import Unavailable
from gpuledger_core.ledger import NodeLedger
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.secure_nats import SecureNats, secure_nats
from gpuledger_inventory.app import serve as serve_inventory
from gpuledger_inventory.settings import InventorySettings
from gpuledger_plugin.ledger_port import StoreLedger
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, running_allocator, running_placement, wait_for

FLEET_YAML = """
nodes:
  - name: node-a
    profile: rtx3090-1
  - name: node-b
    profile: rtx3090-1
"""
FLEET = parse_fleet(FLEET_YAML, "roles-fleet.yaml")


@contextlib.asynccontextmanager
async def connected(server: SecureNats, role: Role, node: str = "") -> AsyncIterator[Client]:
    nc = await bus.connect(server.url, f"test-{role}-{node}", credentials=server.credentials(role, node))
    try:
        yield nc
    finally:
        await nc.close()


async def first(watch: AsyncIterator[NodeLedger | None], check: object) -> NodeLedger:
    async for ledger in watch:
        if ledger is not None and check(ledger):  # type: ignore[operator]
            return ledger
    raise AssertionError("the watch ended")


@contextlib.asynccontextmanager
async def running_inventory(secure: SecureNats, node: str, directory: Path) -> AsyncIterator[None]:
    """The real inventory service of ``node``, on the fake fleet, as ``inventory-<node>``."""
    fleet = directory / "fleet.yaml"
    fleet.write_text(FLEET_YAML)
    creds = secure.credentials(Role.INVENTORY, node)
    settings = InventorySettings(
        node=node,
        nats_url=secure.url,
        fake_fleet=str(fleet),
        http_host="127.0.0.1",
        http_port=0,
        kube="off",
        state_file=str(directory / f"health-{node}.json"),
        nats_user=creds.user,
        nats_password_file=creds.password_file,
        nats_ca_file=creds.ca_file,
    )
    stop = asyncio.Event()
    started: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve_inventory(settings, stop=stop, on_started=started.set_result))
    await asyncio.wait_for(asyncio.shield(started), 10.0)
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10.0)


async def dashboard_history(allocator: RunningAllocator, uuid: str) -> Any:
    url = f"http://127.0.0.1:{allocator.http_port()}/api/nodes/node-a/cards/{uuid}/history"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http, http.get(url) as reply:
        assert reply.status == 200
        return await reply.json()


async def test_every_service_works_with_its_own_user(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with secure_nats(["node-a", "node-b"]) as secure:
        async with (
            running_allocator(secure.url, **secure.credential_settings(Role.ALLOCATOR)) as allocator,
            running_placement(secure.url, **secure.credential_settings(Role.PLACEMENT)),
            running_inventory(secure, "node-a", tmp_path),
        ):
            async with connected(secure, Role.INVENTORY, "node-b") as nc:  # node-b's announced as it would be
                await announce(nc, [n.node for n in FLEET.nodes if n.node.name == "node-b"])
            stub = allocator.stub()

            async def both_nodes() -> bool:
                return len((await stub.get_cluster(pb.GetClusterRequest())).nodes) == 2

            await wait_for(both_nodes, what="both nodes in the ledger")
            request = pb.AllocateRequest(
                owner=pb.Owner(kind="tool", id="ci-runner-1"),
                containers=[pb.ContainerRequest(container="main", request=pb.ResourceRequest(gpu=1))],
                commit=True,
                node="node-a",
            )
            granted = (await stub.allocate(request)).allocation
            async with connected(secure, Role.PLUGIN, "node-a") as nc:
                plugin = StoreLedger(await LedgerStore.open(nc, retry_s=2.0), "node-a")
                seen = await asyncio.wait_for(
                    first(plugin.watch(), lambda ledger: ledger.get(granted.id) is not None), 10.0
                )
                assert seen.node.name == "node-a"
            released = await stub.release(pb.ReleaseRequest(allocation_id=granted.id))
            assert released.state == "released"
            async with connected(secure, Role.OPERATOR) as nc:  # gpuledger health, as the operator
                marked = await set_card_health(nc, "node-a", 0, False, "ops", "fan noise")
                assert marked["changed"] is True
            async with connected(secure, Role.READER) as nc:  # gpuledger health's report: reads only
                card = (await node_report(nc, "node-a")).cards[0]
                assert (card.health, card.by, card.source) == ("unhealthy", "operator:ops", "inventory")
                assert sorted(r.node for r in await cluster_reports(nc)) == ["node-a", "node-b"]
                with pytest.raises(Unavailable):
                    await set_card_health(nc, "node-a", 0, True, "reader", "", timeout=1.0)
            history = await dashboard_history(allocator, card.uuid)  # the allocator asks node-a's inventory
            assert (history["health"], history["source"], history["problem"]) == ("unhealthy", "inventory", "")
            assert [(e["what"], e["by"]) for e in history["history"]] == [("fault", "operator:ops")]
        assert "starting with" in caplog.text  # the settings were logged, and no password with them
        assert not [user for user, password in secure.passwords.items() if password in caplog.text]
        refused = [line for line in secure.log.splitlines() if "Violation" in line]
        assert len(refused) == 1 and "user:reader" in refused[0] and "set_health" in refused[0]
