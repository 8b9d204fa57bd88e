"""Classic mode on a real kubelet: the plugin shim registers with kubelet v1.36's device manager,
kubelet writes the Node's capacity from ListAndWatch, and pods start as real containers whose own
output (their environment and their /dev) shows exactly the cards and limits the ledger holds for
each of their containers, init containers included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpuledger_common import bus, inventory_api
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Grant
from gpuledger_dev.fake_cluster import Outcome
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import RealCluster
from gpuledger_dev.realnode.devices import make_device_nodes
from gpuledger_dev.realnode.node import DEVICE_PLUGIN_DIR
from gpuledger_plugin.podresources import PodResourcesClient
from tests.e2e.helpers import SLOTS_PER_CARD, ledger, namespace, pod, released, share
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

FLEET = Path(__file__).with_name("real_fleet.yaml")
REAL = "real-p4"
GPU = "gpuledger.io/gpu"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def real_stack() -> AsyncIterator[Stack]:
    async with running_stack(load_fleet(FLEET), free_port(), free_port(), _say, "real", real_node=REAL) as stack:
        yield stack


def _say(message: str) -> None:
    print(f"[real-node stack] {message}", flush=True)


def real_cluster(stack: Stack) -> RealCluster:
    assert isinstance(stack.cluster, RealCluster) and stack.cluster.api is not None
    return stack.cluster


async def allocation_of(stack: Stack, uid: str) -> Allocation:
    node: NodeLedger = (await ledger(stack))[REAL]
    (found,) = [a for a in node.live() if a.owner.id == uid]
    return found


def sees_exactly(outcome: Outcome, grant: Grant, minors: dict[str, int]) -> None:
    """The container's own report shows the grant's cards and no other: by UUID, by device node."""
    env, dev = outcome.env[grant.container], outcome.dev[grant.container]
    uuids = [card.uuid for card in grant.cards]
    assert env["CUDA_VISIBLE_DEVICES"].split(",") == uuids
    assert env["GPULEDGER_MEMORY_LIMIT_MIB"].split(",") == [str(card.mem_mib) for card in grant.cards]
    cards_in_dev = sorted(d for d in dev if d.startswith("nvidia") and d[len("nvidia") :].isdigit())
    assert cards_in_dev == sorted(f"nvidia{minors[u]}" for u in uuids), dev
    assert {"nvidiactl", "nvidia-uvm"} <= set(dev), dev
    assert sorted(d.split("/", 1)[1] for d in dev if d.startswith("nvidia-container-devices/")) == sorted(uuids)


async def minors(stack: Stack) -> dict[str, int]:
    node = (await ledger(stack))[REAL].node
    return {card.uuid: card.minor if card.minor is not None else card.index for card in node.cards}


@pytest.mark.timeout(300)
async def test_kubelet_writes_the_capacity_the_plugin_lists(real_stack: Stack) -> None:
    cluster = real_cluster(real_stack)
    assert cluster.api is not None and cluster.real is not None
    found = await cluster.api.get(f"/api/v1/nodes/{REAL}")
    assert found["status"]["capacity"][GPU] == str(2 * SLOTS_PER_CARD)
    assert found["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.36")
    assert cluster.real.leftovers()  # it runs: a kubelet, containerd, their cgroups


@pytest.mark.timeout(300)
async def test_a_shared_pod_sees_its_card_and_its_limit(real_stack: Stack) -> None:
    cluster = real_cluster(real_stack)
    assert cluster.api is not None
    async with namespace(cluster.api, "real-shared", real_stack) as ns:
        outcome = await cluster.run(pod("small", ns, share(1024), node=REAL))
        assert outcome.node == REAL, outcome
        allocation = await allocation_of(real_stack, await cluster.pod_uid(ns, "small"))
        (grant,) = allocation.grants
        assert grant.cards[0].mem_mib == 1024
        sees_exactly(outcome, grant, await minors(real_stack))
        assert outcome.env["app"]["HOSTNAME"] == "small"  # what the container printed, not an answer


def two_containers_and_an_init(name: str, ns: str) -> dict[str, Any]:
    body = pod(name, ns, share(2048), node=REAL)
    spec = body["spec"]
    spec["containers"].append({"name": "side", "image": "cuda", "resources": {"limits": {GPU: "1"}}})
    spec["initContainers"] = [{"name": "setup", "image": "cuda", "resources": {"limits": share(512)}}]
    return body


@pytest.mark.timeout(300)
async def test_every_container_and_the_init_container_see_their_own_cards(real_stack: Stack) -> None:
    cluster = real_cluster(real_stack)
    assert cluster.api is not None
    async with namespace(cluster.api, "real-multi", real_stack) as ns:
        outcome = await cluster.run(two_containers_and_an_init("multi", ns))
        assert outcome.node == REAL, outcome
        allocation = await allocation_of(real_stack, await cluster.pod_uid(ns, "multi"))
        grants = {grant.container: grant for grant in allocation.grants}
        assert set(grants) == {"app", "side", "setup"} == set(outcome.env)
        found = await minors(real_stack)
        for grant in grants.values():
            sees_exactly(outcome, grant, found)
        assert grants["side"].cards[0].exclusive
        assert grants["side"].cards[0].uuid != grants["app"].cards[0].uuid  # the whole card is its alone


@pytest.mark.timeout(300)
async def test_a_pod_on_the_kwok_node_beside_it_still_runs(real_stack: Stack) -> None:
    cluster = real_cluster(real_stack)
    assert cluster.api is not None
    async with namespace(cluster.api, "real-beside", real_stack) as ns:
        outcome = await cluster.run(pod("beside", ns, share(1024), node="kwok-p4"))
        assert outcome.node == "kwok-p4" and outcome.env["app"]["GPULEDGER_MEMORY_LIMIT_MIB"] == "1024"


def checkpointed(uid: str) -> dict[str, frozenset[str]]:
    """kubelet's device checkpoint: container -> the device IDs it holds of gpuledger.io/gpu."""
    data = json.loads((DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint").read_text())["Data"]
    found: dict[str, set[str]] = {}
    for entry in data["PodDeviceEntries"] or []:
        if entry["PodUID"] == uid and entry["ResourceName"] == GPU:
            ids = found.setdefault(entry["ContainerName"], set())
            for per_numa in entry["DeviceIDs"].values():
                ids.update(per_numa)
    return {name: frozenset(ids) for name, ids in found.items()}


@pytest.mark.timeout(300)
async def test_kubelet_takes_the_preferred_devices_and_its_books_agree_with_the_ledger(real_stack: Stack) -> None:
    """kubelet asks GetPreferredAllocation and takes what it says: the device IDs its checkpoint
    and PodResources hold for each container are the ones the ledger reserved for it."""
    cluster = real_cluster(real_stack)
    assert cluster.api is not None and cluster.real is not None
    async with namespace(cluster.api, "real-books", real_stack) as ns:
        outcome = await cluster.run(two_containers_and_an_init("books", ns))
        assert outcome.node == REAL, outcome
        uid = await cluster.pod_uid(ns, "books")
        ledger_ids = {g.container: frozenset(g.device_ids) for g in (await allocation_of(real_stack, uid)).grants}
        assert checkpointed(uid) == ledger_ids
        view = await PodResourcesClient(str(cluster.real.pod_resources_socket), GPU, 5.0).list()
        listed = view[(ns, "books")]
        assert {name: ids for name, ids in listed.items() if ids} == {
            name: ids for name, ids in ledger_ids.items() if name in listed
        }
        assert {"app", "side"} <= set(listed)


async def gpus_allocatable(cluster: RealCluster) -> int:
    assert cluster.api is not None
    found = await cluster.api.get(f"/api/v1/nodes/{REAL}")
    return int(found.get("status", {}).get("allocatable", {}).get(GPU, "0"))


async def container_ids(cluster: RealCluster, ns: str, name: str) -> dict[str, str]:
    assert cluster.api is not None
    found = await cluster.api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return {c["name"]: c.get("containerID", "") for c in found["status"].get("containerStatuses", [])}


@pytest.mark.timeout(300)
async def test_a_kubelet_crash_keeps_every_allocation_and_the_plugin_registers_again(real_stack: Stack) -> None:
    cluster = real_cluster(real_stack)
    assert cluster.api is not None and cluster.real is not None
    async with namespace(cluster.api, "real-restart", real_stack) as ns:
        await cluster.run(pod("before", ns, share(1024), node=REAL))
        uid = await cluster.pod_uid(ns, "before")
        held = {g.container: frozenset(g.device_ids) for g in (await allocation_of(real_stack, uid)).grants}
        running_as = await container_ids(cluster, ns, "before")

        await asyncio.to_thread(cluster.real.restart_kubelet)  # SIGKILL, then the same kubelet again
        await wait_for(gpus_allocatable_is(cluster, 2 * SLOTS_PER_CARD), 90, "the plugin registered again", 0.2)

        after = await cluster.run(pod("after", ns, share(1024), node=REAL))
        assert after.node == REAL and after.env["app"]["GPULEDGER_MEMORY_LIMIT_MIB"] == "1024"
        assert await container_ids(cluster, ns, "before") == running_as  # the same container, never restarted
        assert checkpointed(uid) == held
        assert {g.container: frozenset(g.device_ids) for g in (await allocation_of(real_stack, uid)).grants} == held


def gpus_allocatable_is(cluster: RealCluster, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await gpus_allocatable(cluster) == count

    return check


async def set_health(stack: Stack, card: int, healthy: bool) -> None:
    nc = await bus.connect(stack.nats_url, "e2e-operator", credentials=stack.operator)
    try:
        await inventory_api.set_card_health(nc, REAL, card, healthy, "e2e", "the real-node test")
    finally:
        await nc.close()


@pytest.mark.timeout(300)
async def test_an_unhealthy_card_leaves_its_running_pod_alone_and_takes_no_new_pod(real_stack: Stack) -> None:
    cluster = real_cluster(real_stack)
    assert cluster.api is not None
    async with namespace(cluster.api, "real-unhealthy", real_stack) as ns:
        await cluster.run(pod("holder", ns, {GPU: "2"}, node=REAL))
        holder = await cluster.pod_uid(ns, "holder")
        running_as = await container_ids(cluster, ns, "holder")
        await set_health(real_stack, 1, healthy=False)
        try:
            # The plugin lists card 1's devices unhealthy; kubelet takes them out of allocatable.
            await wait_for(gpus_allocatable_is(cluster, SLOTS_PER_CARD), 60, "card 1 out of allocatable", 0.2)
            assert await container_ids(cluster, ns, "holder") == running_as  # left alone, not restarted
            await cluster.delete(ns, "holder")
            await released(real_stack, holder)
            two = await cluster.run(pod("two-cards", ns, {GPU: "2"}, node=REAL))
            assert not two.node and two.pending, two  # one healthy card left
            one = await cluster.run(pod("one-card", ns, {GPU: "1"}, node=REAL))
            assert one.node == REAL
            cards = [d for d in one.dev["app"] if d.startswith("nvidia") and d[len("nvidia") :].isdigit()]
            assert cards == ["nvidia0"], one.dev
        finally:
            await set_health(real_stack, 1, healthy=True)
        await wait_for(gpus_allocatable_is(cluster, 2 * SLOTS_PER_CARD), 60, "card 1 back", 0.2)


@pytest.mark.timeout(300)
async def test_a_card_whose_device_node_is_missing_fails_the_pod_with_the_plugins_reason(real_stack: Stack) -> None:
    """kubelet fails the pod's admission with what the plugin said: it never runs without its cards."""
    cluster = real_cluster(real_stack)
    assert cluster.api is not None
    device = cluster.device_dir(REAL) / "nvidia1"
    device.unlink()
    try:
        async with namespace(cluster.api, "real-no-device", real_stack) as ns:
            outcome = await cluster.run(pod("both", ns, {GPU: "2"}, node=REAL))
            assert outcome.node == REAL and outcome.pending.startswith("kubelet refused it"), outcome
            assert f"gpuledger-plugin on node {REAL}" in outcome.pending and str(device) in outcome.pending
            found = await cluster.api.get(f"/api/v1/namespaces/{ns}/pods/both")
            assert found["status"]["reason"] == "UnexpectedAdmissionError"
            await released(real_stack, found["metadata"]["uid"])  # the failed pod's reservation is given back
    finally:
        make_device_nodes(cluster.device_dir(REAL), [1])
