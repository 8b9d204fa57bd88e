"""Each service does its work with its own NATS user and nothing more: the allocator and
placement as themselves, each node's inventory and plugin as that node's users, over TLS."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.fleet import parse_fleet
from gpuledger_common.natsauth import Role
from gpuledger_common.store import LedgerStore
from gpuledger_core.ledger import NodeLedger
from gpuledger_plugin.ledger import StoreLedger
from gpuledger_proto.gpuledger.allocator import v1 as pb
from gpuledger_testing.secure_nats import SecureNats, secure_nats
from gpuledger_testing.stack import running_allocator, running_placement, wait_for

FLEET = parse_fleet(
    """
nodes:
  - name: node-a
    profile: rtx3090-1
  - name: node-b
    profile: rtx3090-1
""",
    "roles-fleet.yaml",
)


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


async def test_every_service_works_with_its_own_user() -> None:
    async with secure_nats(["node-a", "node-b"]) as secure:
        async with (
            running_allocator(secure.url, **secure.credential_settings(Role.ALLOCATOR)) as allocator,
            running_placement(secure.url, **secure.credential_settings(Role.PLACEMENT)),
        ):
            for entry in FLEET.nodes:  # each node's inventory speaks for its own node only
                async with connected(secure, Role.INVENTORY, entry.node.name) as nc:
                    await announce(nc, [entry.node])
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
        violations = [line for line in secure.log.splitlines() if "Violation" in line]
        assert violations == []
