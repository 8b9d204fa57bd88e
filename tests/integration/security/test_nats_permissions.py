"""NATS least privilege against a real nats-server: TLS, a user per role and per node, and the
subject permissions of ``gpuledger_common.natsauth``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout

from gpuledger_common import bus, inventory_api
from gpuledger_common.announce import announce
from gpuledger_common.natsauth import Role
from gpuledger_common.natscreds import NatsCredentials
from gpuledger_common.store import LedgerStore, Transition, node_key
from gpuledger_common.store.follow import node_ledger
from gpuledger_common.store.ledgerwait import open_ledger
from gpuledger_core import codec
from gpuledger_core.errors import GpuledgerError, Unavailable
from gpuledger_core.ledger import NodeLedger, with_node
from gpuledger_core.model import MigSlot, Node
from gpuledger_dev.fleet import Fleet, parse_fleet
from gpuledger_dev.secure_nats import SecureNats, secure_nats
from gpuledger_dev.tlsca import ThrowawayCa
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import running_allocator
from tests.support.waiting import wait_for

FLEET = """
nodes:
  - name: node-a
    profile: rtx3090-1
  - name: node-b
    profile: rtx3090-1
"""


@pytest.fixture
def fleet() -> Fleet:
    return parse_fleet(FLEET, "security-fleet.yaml")


@pytest.fixture
async def secure(fleet: Fleet) -> AsyncIterator[SecureNats]:
    async with secure_nats(n.node.name for n in fleet.nodes) as server:
        yield server


@contextlib.asynccontextmanager
async def connected(server: SecureNats, role: Role, node: str = "") -> AsyncIterator[Client]:
    nc = await bus.connect(server.url, f"test-{role}", credentials=server.credentials(role, node))
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
async def ledger(secure: SecureNats, fleet: Fleet) -> AsyncIterator[LedgerStore]:
    """The allocator's store, both nodes written."""
    async with connected(secure, Role.ALLOCATOR) as nc:
        store = await LedgerStore.open(nc, record_ttls=True, deny_rollups=True)
        for entry in fleet.nodes:
            await store.mutate(entry.node.name, fresh(entry.node))
        yield store


def fresh(node: Node) -> Transition:
    return lambda _: NodeLedger(node)


def labelled(label: str) -> Transition:
    def transition(ledger: NodeLedger | None) -> NodeLedger:
        assert ledger is not None
        return with_node(ledger, dataclasses.replace(ledger.node, labels=(("test", label),)))

    return transition


def violations(server: SecureNats, user: str, subject: str) -> int:
    return sum(1 for line in server.log.splitlines() if f"user:{user}" in line and f'Subject "{subject}"' in line)


async def test_a_nodes_plugin_writes_its_own_key_and_not_another_nodes(secure: SecureNats, ledger: LedgerStore) -> None:
    async with connected(secure, Role.PLUGIN, "node-a") as nc:
        plugin = await LedgerStore.open(nc, retry_s=1.0)
        written = await plugin.mutate("node-a", labelled("mine"))
        assert written.new is not None and written.new.node.labels == (("test", "mine"),)
        _, before = await ledger.read("node-b")
        with pytest.raises(NatsTimeout):  # nothing answers a refused publish: the put times out
            await nc.jetstream(timeout=1.0).publish(f"$KV.gpuledger-ledger.{node_key('node-b')}", b"{}")
    after, revision = await ledger.read("node-b")
    assert revision == before and after is not None and after.node.labels == ()
    assert violations(secure, "plugin-node-a", "$KV.gpuledger-ledger.node.node-b") >= 1


async def test_a_rollup_on_a_nodes_own_key_cannot_empty_the_bucket(secure: SecureNats, ledger: LedgerStore) -> None:
    async with connected(secure, Role.PLUGIN, "node-a") as nc:
        with pytest.raises(Exception, match=r"(?i)rollup"):
            await nc.jetstream().publish(
                f"$KV.gpuledger-ledger.{node_key('node-a')}", b"{}", headers={"Nats-Rollup": "all"}
            )
    assert set(await ledger.nodes()) == {"node-a", "node-b"}


async def test_the_inventory_publishes_only_its_own_nodes_subjects(secure: SecureNats, ledger: LedgerStore) -> None:
    heard: list[str] = []

    async def on_msg(msg: object) -> None:
        heard.append(msg.subject)  # type: ignore[attr-defined]

    subs = [await ledger.nc.subscribe(f"gpuledger.v1.{kind}.*", cb=on_msg) for kind in ("inventory", "heartbeat")]
    await ledger.nc.flush()
    async with connected(secure, Role.INVENTORY, "node-a") as nc:
        for subject in (
            "gpuledger.v1.heartbeat.node-b",
            "gpuledger.v1.inventory.node-b",
            "gpuledger.v1.heartbeat.node-a",
        ):
            await nc.publish(subject, b'{"node": "x"}')
        await nc.flush()

    async def own_only() -> bool:
        return heard == ["gpuledger.v1.heartbeat.node-a"]

    await wait_for(own_only, what="node-a's own heartbeat only")
    for sub in subs:
        await sub.unsubscribe()
    assert violations(secure, "inventory-node-a", "gpuledger.v1.inventory.node-b") == 1


async def test_the_inventory_watches_its_own_nodes_ledger_and_writes_none(
    secure: SecureNats, ledger: LedgerStore
) -> None:
    """DRA mode: the inventory follows its node's ledger (the slices' taints) and may not write it."""
    async with connected(secure, Role.INVENTORY, "node-a") as nc:
        store = await open_ledger(nc, None, retry_s=1.0)
        seen = await anext(node_ledger(store, "node-a"))
        assert seen is not None and seen.node.name == "node-a"
        with pytest.raises(NatsTimeout):  # nothing answers a refused publish: the put times out
            await nc.jetstream(timeout=1.0).publish(f"$KV.gpuledger-ledger.{node_key('node-a')}", b"{}")
    assert violations(secure, "inventory-node-a", "$KV.gpuledger-ledger.node.node-a") >= 1


async def test_a_reader_reads_and_cannot_write(secure: SecureNats, ledger: LedgerStore) -> None:
    async with connected(secure, Role.READER) as nc:
        reader = await LedgerStore.open(nc, retry_s=1.0)
        found, _ = await reader.read("node-b")
        assert found is not None and found.node.name == "node-b"
        with pytest.raises(GpuledgerError):
            await reader.mutate("node-b", labelled("reader"))
        await nc.publish("gpuledger.v1.allocator.release", b'{"allocation_id": "x"}')
        await nc.flush()
    assert violations(secure, "reader", "$KV.gpuledger-ledger.node.node-b") >= 1
    assert violations(secure, "reader", "gpuledger.v1.allocator.release") == 1
    node_b, _ = await ledger.read("node-b")
    assert node_b is not None and node_b.node.labels == ()


async def test_the_allocator_reads_an_inventory_and_cannot_mark_a_card(secure: SecureNats) -> None:
    """The dashboard's card history: the allocator asks node-a's inventory ``get``; its
    ``set_health`` stays the operator's."""
    asked: list[str] = []

    async def handler(body: object) -> object:
        asked.append("get")
        return {"node": {"name": "node-a"}}

    async with connected(secure, Role.INVENTORY, "node-a") as inventory, connected(secure, Role.ALLOCATOR) as nc:
        responder = await bus.Responder(inventory, inventory_api.get_subject("node-a"), handler).start()
        marker = await bus.Responder(inventory, inventory_api.set_health_subject("node-a"), handler).start()
        try:
            said = await inventory_api.get_inventory(nc, "node-a", timeout=5.0)
            assert said["node"]["name"] == "node-a"
            with pytest.raises(Unavailable):  # a refused publish: nothing answers
                await inventory_api.set_card_health(nc, "node-a", 0, True, "allocator", timeout=1.0)
        finally:
            await marker.close()
            await responder.close()
    assert asked == ["get"]
    assert violations(secure, "allocator", "gpuledger.v1.inventory.node-a.set_health") == 1


async def test_a_nodes_plugin_asks_its_own_inventory_for_a_mig_instance_and_no_other(secure: SecureNats) -> None:
    """``mig.make``: node-a's plugin asks node-a's inventory, and so does placement (mode C makes a
    claim's instances before writing its allocation); node-b's plugin and a reader cannot."""
    asked: list[object] = []
    made = inventory_api.MadeMig("MIG-x", 13, 0, 0, 0)

    async def handler(body: object) -> object:
        asked.append(body)
        return made.to_json()

    slot = MigSlot("1g.5gb", 6, 1)
    async with contextlib.AsyncExitStack() as stack:
        inventory = await stack.enter_async_context(connected(secure, Role.INVENTORY, "node-a"))
        plugin_a = await stack.enter_async_context(connected(secure, Role.PLUGIN, "node-a"))
        plugin_b = await stack.enter_async_context(connected(secure, Role.PLUGIN, "node-b"))
        reader = await stack.enter_async_context(connected(secure, Role.READER))
        placement = await stack.enter_async_context(connected(secure, Role.PLACEMENT))
        responder = await bus.Responder(inventory, inventory_api.mig_make_subject("node-a"), handler).start()
        stack.push_async_callback(responder.close)
        assert await inventory_api.make_mig(plugin_a, "node-a", "GPU-a", slot, "alloc-1", 5.0) == made
        assert await inventory_api.make_mig(placement, "node-a", "GPU-a", slot, "alloc-c", 5.0) == made
        for other in (plugin_b, reader):
            with pytest.raises(Unavailable):  # a refused publish: nothing answers
                await inventory_api.make_mig(other, "node-a", "GPU-a", slot, "alloc-2", 1.0)
    assert [b["holder"] for b in asked if isinstance(b, dict)] == ["alloc-1", "alloc-c"]
    assert violations(secure, "plugin-node-b", "gpuledger.v1.inventory.node-a.mig.make") == 1
    assert violations(secure, "reader", "gpuledger.v1.inventory.node-a.mig.make") == 1


async def test_a_user_cannot_read_replies_to_another(secure: SecureNats) -> None:
    async with connected(secure, Role.PLUGIN, "node-a") as nc:
        await nc.subscribe("_INBOX.allocator.>")
        await nc.flush()
        await asyncio.sleep(0)  # the server answers a refused subscription with -ERR, logged

    async def refused() -> bool:
        return violations(secure, "plugin-node-a", "_INBOX.allocator.>") == 1

    await wait_for(refused, what="the subscription refused")


async def test_the_wrong_ca_is_refused(secure: SecureNats, tmp_path: Path) -> None:
    other = ThrowawayCa(tmp_path / "other", "some-other-ca")
    creds = secure.credentials(Role.READER, ca_file=str(other.cert))
    with pytest.raises(Unavailable, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        await bus.connect(secure.url, "test-wrong-ca", connect_timeout=2.0, credentials=creds)


async def test_no_tls_and_no_credentials_are_refused(secure: SecureNats) -> None:
    plain = secure.url.replace("tls://", "nats://")
    with pytest.raises(Unavailable):
        await bus.connect(plain, "test-no-tls", connect_timeout=2.0)
    with pytest.raises(Unavailable, match=r"[Aa]uthorization"):
        await bus.connect(
            secure.url, "test-no-user", connect_timeout=2.0, credentials=NatsCredentials(ca_file=str(secure.ca.cert))
        )


async def test_a_wrong_password_is_refused(secure: SecureNats) -> None:
    creds = secure.password_credentials("plugin-node-a", secure.passwords["plugin-node-b"])
    with pytest.raises(Unavailable, match=r"[Aa]uthorization"):
        await bus.connect(secure.url, "test-wrong-password", connect_timeout=2.0, credentials=creds)


async def test_a_consumer_aimed_at_a_request_subject_is_not_a_request(secure: SecureNats, ledger: LedgerStore) -> None:
    """A node may write anything to its own key (here: a request for someone else's allocation)
    and have a consumer deliver it to any subject
    (nats-server does not check a consumer's deliver subject against its maker's permissions);
    the delivery keeps the stream's subject, and a responder takes only its own subject."""
    answered: list[object] = []

    async def handler(body: object) -> object:
        answered.append(body)
        return {}

    delivered: list[str] = []

    async def watch(msg: object) -> None:
        delivered.append(msg.subject)  # type: ignore[attr-defined]

    # (on a connection of its own: nats-server lets a client answer a request once, and not at
    # all when two of its subscriptions received it)
    async with connected(secure, Role.ALLOCATOR) as watcher, connected(secure, Role.PLUGIN, "node-a") as nc:
        await watcher.subscribe("gpuledger.v1.allocator.get", cb=watch)
        await watcher.flush()
        responder = await bus.Responder(ledger.nc, "gpuledger.v1.allocator.get", handler).start()
        await ledger.nc.flush()
        crafted = orjson.dumps({"allocation_id": "someone-elses"})
        await nc.jetstream().publish(f"$KV.gpuledger-ledger.{node_key('node-a')}", crafted)
        config = {
            "deliver_subject": "gpuledger.v1.allocator.get",
            "filter_subject": f"$KV.gpuledger-ledger.{node_key('node-a')}",
            "deliver_policy": "last_per_subject",
            "ack_policy": "none",
        }
        reply = await nc.request(
            "$JS.API.CONSUMER.CREATE.KV_gpuledger-ledger",
            orjson.dumps({"stream_name": "KV_gpuledger-ledger", "config": config}),
            timeout=5.0,
        )
        assert "error" not in orjson.loads(reply.data)  # the server made it: the responder must hold

        async def arrived() -> bool:
            return delivered != []

        await wait_for(arrived, what="the consumer's delivery")
    # The responder takes messages in order: once a real request is answered, the delivery
    # before it has been seen (and, with the check, ignored).
    async with connected(secure, Role.READER) as reader:
        await bus.request(reader, "gpuledger.v1.allocator.get", {"allocation_id": "real"})
    await responder.close()
    assert [body["allocation_id"] for body in answered] == ["real"]  # type: ignore[index]


async def test_a_node_cannot_speak_for_another_node(secure: SecureNats, fleet: Fleet) -> None:
    """Node A's inventory may publish on its own subject only; a body there naming node B is
    not taken as node B's inventory (the allocator once took the node from the body)."""
    node_a, node_b = (entry.node for entry in fleet.nodes)
    async with running_allocator(secure.url, **secure.credential_settings(Role.ALLOCATOR)) as allocator:
        for node in (node_a, node_b):
            async with connected(secure, Role.INVENTORY, node.name) as nc:
                await announce(nc, [node])
        stub = allocator.stub()

        async def both() -> bool:
            return len((await stub.get_cluster(pb.GetClusterRequest())).nodes) == 2

        await wait_for(both, what="both nodes in the ledger")
        forged = dataclasses.replace(node_b, cards=node_b.cards[:0])  # node B without its cards
        relabelled = dataclasses.replace(node_a, labels=(("zone", "a2"),))
        async with connected(secure, Role.INVENTORY, "node-a") as nc:
            body = {"node": codec.node_to(forged), "at": 1.0, "extra": {}}
            await nc.publish("gpuledger.v1.inventory.node-a", bus.encode(body))
            await announce(nc, [relabelled])  # then a true one: once it is in, the forged one was seen

        async with connected(secure, Role.READER) as reader:
            store = await LedgerStore.open(reader, retry_s=1.0)

            async def a_relabelled() -> bool:
                found, _ = await store.read("node-a")
                return found is not None and found.node.labels == (("zone", "a2"),)

            await wait_for(a_relabelled, what="node-a relabelled")
            b, _ = await store.read("node-b")
            assert b is not None and len(b.node.cards) == len(node_b.cards) > 0
