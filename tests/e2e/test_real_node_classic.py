"""Classic mode on a real kubelet, and the same assertions on the simulated one beside it.

The plugin shim registers with kubelet v1.36's device manager, kubelet writes the Node's capacity
from ListAndWatch, and pods start as real containers whose own output (their environment and
their /dev) shows exactly the cards and limits the ledger holds for each of their containers,
init containers included. Every test that does not need a container runs on both nodes of the
fleet: ``real-p4`` (kubelet and containerd) and ``kwok-p4`` (the simulated kubelet of the other
e2e tests), so the simulation is held to the real kubelet by the same assertions."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpuledger_common import bus, inventory_api
from gpuledger_core.model import Allocation, AllocState, Grant
from gpuledger_dev.fake_cluster import Outcome
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import CDI_ENV_PREFIX, TOOLKIT_SPEC, RealCluster, reporting
from gpuledger_dev.realnode.devices import make_device_nodes
from gpuledger_dev.realnode.residue import DEVICE_PLUGIN_DIR
from gpuledger_plugin.podresources import PodResourcesClient
from tests.e2e.helpers import SLOTS_PER_CARD, card_nodes, ledger, namespace, pod, released, share
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

FLEET = Path(__file__).with_name("real_fleet.yaml")
REAL, KWOK = "real-p4", "kwok-p4"
GPU = "gpuledger.io/gpu"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def real_stack() -> AsyncIterator[Stack]:
    async with running_stack(load_fleet(FLEET), free_port(), free_port(), _say, "real", real_node=REAL) as stack:
        yield stack


def _say(message: str) -> None:
    print(f"[real-node stack] {message}", flush=True)


@dataclass(frozen=True)
class Kubelet:
    """One node of the fleet and what its kubelet, real or simulated, says."""

    stack: Stack
    node: str

    @property
    def cluster(self) -> RealCluster:
        assert isinstance(self.stack.cluster, RealCluster) and self.stack.cluster.api is not None
        return self.stack.cluster

    @property
    def real(self) -> bool:
        return self.node == REAL

    def ns(self, name: str) -> str:
        return f"{name}-{'real' if self.real else 'sim'}"

    def held(self, uid: str) -> dict[str, frozenset[str]]:
        """kubelet's own record of the device IDs each container of the pod holds: the real one's
        checkpoint file, the simulated one's device manager."""
        if self.real:
            return checkpointed(uid)
        assignments = self.cluster.kubelets[self.node].assignments.get(uid, {})
        return {container: frozenset(ids) for container, ids in assignments.items()}

    async def listed(self, ns: str, name: str) -> Mapping[str, frozenset[str]]:
        """What kubelet's PodResources List says the pod's containers hold."""
        view = await PodResourcesClient(str(self.cluster.pod_resources(self.node)), GPU, 5.0).list()
        return view[(ns, name)]

    async def crash(self) -> None:
        """Kill kubelet and start it again (the simulated one: as kubelet restarts), then wait until
        the plugin registered again: kubelet deletes every socket in its device-plugin directory
        when it starts, and the plugin serves a new one and registers it."""
        if self.real:
            assert self.cluster.real is not None
            socket = self.cluster.plugin_dir(self.node) / "gpuledger.sock"
            before = socket.stat().st_ctime_ns  # inode numbers come back: a new socket has a new ctime
            await asyncio.to_thread(self.cluster.real.restart_kubelet)

            async def registered() -> bool:
                return socket.exists() and socket.stat().st_ctime_ns != before and await self.allocatable() > 0

        else:
            simulated = self.cluster.kubelets[self.node]
            await simulated.restart()

            async def registered() -> bool:
                return simulated.registered and await self.allocatable() > 0

        await wait_for(registered, 90, "the plugin registered again", 0.2)

    async def allocatable(self) -> int:
        assert self.cluster.api is not None
        found = await self.cluster.api.get(f"/api/v1/nodes/{self.node}")
        return int(found.get("status", {}).get("allocatable", {}).get(GPU, "0"))

    def allocatable_is(self, count: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return await self.allocatable() == count

        return check

    async def allocation_of(self, uid: str) -> Allocation:
        (found,) = [a for a in (await ledger(self.stack))[self.node].live() if a.owner.id == uid]
        return found

    async def minors(self) -> dict[str, int]:
        node = (await ledger(self.stack))[self.node].node
        return {card.uuid: card.minor if card.minor is not None else card.index for card in node.cards}

    async def container_ids(self, ns: str, name: str) -> dict[str, str]:
        """The real node's container IDs (the simulated kubelet runs no container: empty)."""
        assert self.cluster.api is not None
        found = await self.cluster.api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        statuses = found["status"].get("containerStatuses", []) if self.real else []
        return {c["name"]: c.get("containerID", "") for c in statuses}


@pytest.fixture(params=[REAL, KWOK], ids=["real-kubelet", "simulated-kubelet"])
def kubelet(request: pytest.FixtureRequest, real_stack: Stack) -> Kubelet:
    return Kubelet(real_stack, request.param)


@pytest.fixture
def real(real_stack: Stack) -> Kubelet:
    return Kubelet(real_stack, REAL)


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


def sees_exactly(outcome: Outcome, grant: Grant, minors: dict[str, int]) -> None:
    """The container got the grant's cards and no other: by UUID and limit, and on the real node by
    what the container printed of its own /dev and NVIDIA's volume-mounted device list."""
    env = outcome.env[grant.container]
    uuids = [card.uuid for card in grant.cards]
    assert env["CUDA_VISIBLE_DEVICES"].split(",") == uuids
    assert env["GPULEDGER_MEMORY_LIMIT_MIB"].split(",") == [str(card.mem_mib) for card in grant.cards]
    if not outcome.dev:
        return  # the simulated kubelet: the Allocate answer, as it recorded it
    dev = outcome.dev[grant.container]
    assert card_nodes(dev) == sorted(f"nvidia{minors[u]}" for u in uuids), dev
    assert {"nvidiactl", "nvidia-uvm"} <= set(dev), dev
    assert sorted(d.split("/", 1)[1] for d in dev if d.startswith("nvidia-container-devices/")) == sorted(uuids)
    applied = {k: v for k, v in env.items() if k.startswith(CDI_ENV_PREFIX)}  # the CDI devices containerd applied
    assert applied == {f"{CDI_ENV_PREFIX}{minors[u]}": u for u in uuids}, applied


def two_containers_and_an_init(name: str, ns: str, node: str) -> dict[str, Any]:
    body = pod(name, ns, share(2048), node=node)
    spec = body["spec"]
    spec["containers"].append({"name": "side", "image": "cuda", "resources": {"limits": {GPU: "1"}}})
    spec["initContainers"] = [{"name": "setup", "image": "cuda", "resources": {"limits": share(512)}}]
    return body


@pytest.mark.timeout(300)
async def test_kubelet_writes_the_capacity_the_plugin_lists(kubelet: Kubelet) -> None:
    assert await kubelet.allocatable() == 2 * SLOTS_PER_CARD
    if kubelet.real:
        assert kubelet.cluster.real is not None and kubelet.cluster.real.leftovers()  # it runs


@pytest.mark.timeout(300)
async def test_a_shared_pod_sees_its_card_and_its_limit(kubelet: Kubelet) -> None:
    cluster = kubelet.cluster
    assert cluster.api is not None
    async with namespace(cluster.api, kubelet.ns("shared"), kubelet.stack) as ns:
        outcome = await cluster.run(pod("small", ns, share(1024), node=kubelet.node))
        assert outcome.node == kubelet.node, outcome
        (grant,) = (await kubelet.allocation_of(await cluster.pod_uid(ns, "small"))).grants
        assert grant.cards[0].mem_mib == 1024
        sees_exactly(outcome, grant, await kubelet.minors())
        if kubelet.real:
            assert outcome.env["app"]["HOSTNAME"] == "small"  # printed by the container itself


@pytest.mark.timeout(300)
async def test_every_container_and_the_init_container_see_their_own_cards(kubelet: Kubelet) -> None:
    cluster = kubelet.cluster
    assert cluster.api is not None
    async with namespace(cluster.api, kubelet.ns("multi"), kubelet.stack) as ns:
        outcome = await cluster.run(two_containers_and_an_init("multi", ns, kubelet.node))
        assert outcome.node == kubelet.node, outcome
        grants = {g.container: g for g in (await kubelet.allocation_of(await cluster.pod_uid(ns, "multi"))).grants}
        assert set(grants) == {"app", "side", "setup"} == set(outcome.env)
        minors = await kubelet.minors()
        for grant in grants.values():
            sees_exactly(outcome, grant, minors)
        assert grants["side"].cards[0].exclusive
        assert grants["side"].cards[0].uuid != grants["app"].cards[0].uuid  # the whole card is its alone


@pytest.mark.timeout(300)
async def test_kubelet_takes_the_preferred_devices_and_its_books_agree_with_the_ledger(kubelet: Kubelet) -> None:
    """kubelet asks GetPreferredAllocation and takes what it says: the device IDs its own record
    and PodResources hold for each container are the ones the ledger reserved for it."""
    cluster = kubelet.cluster
    assert cluster.api is not None
    async with namespace(cluster.api, kubelet.ns("books"), kubelet.stack) as ns:
        outcome = await cluster.run(two_containers_and_an_init("books", ns, kubelet.node))
        assert outcome.node == kubelet.node, outcome
        uid = await cluster.pod_uid(ns, "books")
        reserved = {g.container: frozenset(g.device_ids) for g in (await kubelet.allocation_of(uid)).grants}
        assert kubelet.held(uid) == reserved
        listed = await kubelet.listed(ns, "books")
        assert {"app", "side"} <= set(listed)
        assert {name: ids for name, ids in listed.items() if ids} == {
            name: ids for name, ids in reserved.items() if name in listed
        }


@pytest.mark.timeout(300)
async def test_a_kubelet_crash_keeps_every_allocation_and_the_plugin_registers_again(kubelet: Kubelet) -> None:
    cluster = kubelet.cluster
    assert cluster.api is not None
    async with namespace(cluster.api, kubelet.ns("restart"), kubelet.stack) as ns:
        await cluster.run(pod("before", ns, share(1024), node=kubelet.node))
        uid = await cluster.pod_uid(ns, "before")
        held = {g.container: frozenset(g.device_ids) for g in (await kubelet.allocation_of(uid)).grants}
        running_as = await kubelet.container_ids(ns, "before")

        await kubelet.crash()
        assert await kubelet.allocatable() == 2 * SLOTS_PER_CARD

        after = await cluster.run(pod("after", ns, share(1024), node=kubelet.node))
        assert after.node == kubelet.node and after.env["app"]["GPULEDGER_MEMORY_LIMIT_MIB"] == "1024"
        assert await kubelet.container_ids(ns, "before") == running_as  # the same container, never restarted
        assert kubelet.held(uid) == held
        assert {g.container: frozenset(g.device_ids) for g in (await kubelet.allocation_of(uid)).grants} == held


async def set_health(kubelet: Kubelet, card: int, healthy: bool) -> None:
    nc = await bus.connect(kubelet.stack.nats_url, "e2e-operator", credentials=kubelet.stack.operator)
    try:
        await inventory_api.set_card_health(nc, kubelet.node, card, healthy, "e2e", "the real-node test")
    finally:
        await nc.close()


@pytest.mark.timeout(300)
async def test_an_unhealthy_card_leaves_its_running_pod_alone_and_takes_no_new_pod(kubelet: Kubelet) -> None:
    cluster = kubelet.cluster
    assert cluster.api is not None
    async with namespace(cluster.api, kubelet.ns("unhealthy"), kubelet.stack) as ns:
        await cluster.run(pod("holder", ns, {GPU: "2"}, node=kubelet.node))
        holder = await cluster.pod_uid(ns, "holder")
        running_as = await kubelet.container_ids(ns, "holder")
        await set_health(kubelet, 1, healthy=False)
        try:
            # The plugin lists card 1's devices unhealthy; kubelet takes them out of allocatable.
            await wait_for(kubelet.allocatable_is(SLOTS_PER_CARD), 60, "card 1 out of allocatable", 0.2)
            found = await cluster.api.get(f"/api/v1/namespaces/{ns}/pods/holder")
            assert found["status"]["phase"] == "Running"  # left alone
            assert await kubelet.container_ids(ns, "holder") == running_as  # and not restarted
            await cluster.delete(ns, "holder")
            await released(kubelet.stack, holder)
            two = await cluster.run(pod("two-cards", ns, {GPU: "2"}, node=kubelet.node))
            assert not two.node and two.pending, two  # one healthy card left
            one = await cluster.run(pod("one-card", ns, {GPU: "1"}, node=kubelet.node))
            assert one.node == kubelet.node
            card = next(c for c in (await ledger(kubelet.stack))[kubelet.node].node.cards if c.index == 0)
            assert one.env["app"]["CUDA_VISIBLE_DEVICES"] == card.uuid
            if kubelet.real:
                assert card_nodes(one.dev["app"]) == ["nvidia0"], one.dev
        finally:
            await set_health(kubelet, 1, healthy=True)
        await wait_for(kubelet.allocatable_is(2 * SLOTS_PER_CARD), 60, "card 1 back", 0.2)


@pytest.mark.timeout(300)
async def test_a_card_whose_device_node_is_missing_fails_the_pod_with_the_plugins_reason(real: Kubelet) -> None:
    """kubelet fails the pod's admission with what the plugin said: it never runs without its cards.
    (The real node only: the simulated kubelet starts no container, so its plugin names no device.)"""
    cluster = real.cluster
    assert cluster.api is not None
    device = cluster.device_dir(REAL) / "nvidia1"
    device.unlink()
    try:
        async with namespace(cluster.api, "real-no-device", real.stack) as ns:
            outcome = await cluster.run(pod("both", ns, {GPU: "2"}, node=REAL))
            assert outcome.node == REAL and outcome.pending.startswith("kubelet refused it"), outcome
            assert f"gpuledger-plugin on node {REAL}" in outcome.pending and str(device) in outcome.pending
            found = await cluster.api.get(f"/api/v1/namespaces/{ns}/pods/both")
            assert found["status"]["reason"] == "UnexpectedAdmissionError"
            await released(real.stack, found["metadata"]["uid"])  # the failed pod's reservation is given back
    finally:
        make_device_nodes(cluster.device_dir(REAL), [1])


@pytest.mark.timeout(300)
async def test_a_card_no_cdi_spec_defines_fails_the_pod_with_the_plugins_reason(real: Kubelet) -> None:
    """The plugin names the cards as CDI devices too; with the toolkit's spec gone, containerd
    could not resolve them and would fail the container after admission. The plugin refuses
    instead, and kubelet fails the pod with its reason."""
    cluster = real.cluster
    assert cluster.api is not None and cluster.real is not None
    spec = cluster.real.cdi_dir / TOOLKIT_SPEC
    kept = spec.read_text()
    spec.unlink()
    try:
        async with namespace(cluster.api, "real-no-cdi", real.stack) as ns:
            outcome = await cluster.run(pod("unresolved", ns, {GPU: "1"}, node=REAL))
            assert outcome.node == REAL and outcome.pending.startswith("kubelet refused it"), outcome
            assert f"gpuledger-plugin on node {REAL}" in outcome.pending, outcome.pending
            assert "no CDI spec in" in outcome.pending and "nvidia.com/gpu=GPU-" in outcome.pending, outcome.pending
            found = await cluster.api.get(f"/api/v1/namespaces/{ns}/pods/unresolved")
            assert found["status"]["reason"] == "UnexpectedAdmissionError"
            await released(real.stack, found["metadata"]["uid"])
    finally:
        spec.write_text(kept)


@pytest.mark.timeout(300)
async def test_a_pod_whose_reservation_the_node_saw_is_admitted_while_nats_is_frozen(real: Kubelet) -> None:
    """kubelet calls GetPreferredAllocation and Allocate with no deadline and fails the pod on an
    error from either: with nats-server frozen after the bind, each answers from the node's last
    known ledger once the ledger has answered nothing for ``unreachable_wait_s`` (3 s), the pod
    runs, and its bind is written once NATS is back."""
    cluster, stack, nats = real.cluster, real.stack, real.stack.nats.process
    assert cluster.api is not None and nats is not None
    async with namespace(cluster.api, "real-outage", stack) as ns:
        await bound_then_frozen(real, ns, "frozen")
        started = time.monotonic()
        try:
            found = await wait_for(phase_of(cluster, ns, "frozen", {"Running", "Failed"}), 60, "admitted", 0.1)
            took = time.monotonic() - started
        finally:
            os.kill(nats.pid, signal.SIGCONT)
        assert found["status"]["phase"] == "Running", found["status"]
        assert took < 20, took  # two answers of about 3 s each, and the container's start
        await wait_for(bound_in_the_ledger(stack, found["metadata"]["uid"]), 60, "bound once NATS is back", 0.5)


async def bound_then_frozen(real: Kubelet, ns: str, name: str) -> None:
    """A pod for 512 MiB of a card on the real node, bound while kubelet is paused (the reservation
    is written before the bind, and the plugin's watch brings it); then nats-server is frozen and
    kubelet resumed: it admits the pod with the ledger out of reach."""
    cluster, nats = real.cluster, real.stack.nats.process
    assert cluster.api is not None and cluster.real is not None and nats is not None
    kubelet = cluster.real.processes["kubelet"].popen
    assert kubelet is not None
    os.kill(kubelet.pid, signal.SIGSTOP)
    try:
        body = pod(name, ns, share(512), node=REAL)
        body["spec"] = reporting(body["spec"])
        await cluster.api.create(f"/api/v1/namespaces/{ns}/pods", body)
        await wait_for(bound_to_node(cluster, ns, name), 60, "the pod bound", 0.1)
        await asyncio.sleep(1.0)  # the plugin's watch brings the reservation
        os.kill(nats.pid, signal.SIGSTOP)
    finally:
        os.kill(kubelet.pid, signal.SIGCONT)


def bound_in_the_ledger(stack: Stack, uid: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        held = [a for a in (await ledger(stack))[REAL].live() if a.owner.id == uid]
        return bool(held) and all(a.state is AllocState.BOUND for a in held)

    return check


def bound_to_node(cluster: RealCluster, ns: str, name: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        assert cluster.api is not None
        found = await cluster.api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return bool(found["spec"].get("nodeName"))

    return check


def phase_of(
    cluster: RealCluster, ns: str, name: str, phases: set[str]
) -> Callable[[], Awaitable[dict[str, Any] | None]]:
    async def check() -> dict[str, Any] | None:
        assert cluster.api is not None
        found = await cluster.api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return found if found.get("status", {}).get("phase") in phases else None

    return check


@pytest.mark.timeout(300)
async def test_a_kubelet_killed_mid_admission_leaves_the_plugin_serving_and_the_pod_runs(real: Kubelet) -> None:
    """kubelet is killed while the plugin waits for a frozen ledger in the middle of a pod's
    admission; the plugin serves on (the same process), the restarted kubelet admits the pod, and
    its bind is written once NATS is back."""
    cluster, stack, nats = real.cluster, real.stack, real.stack.nats.process
    plugin = stack.supervisor.get(f"plugin-{REAL}").process
    assert cluster.api is not None and cluster.real is not None and nats is not None and plugin is not None
    async with namespace(cluster.api, "real-mid-admission", stack) as ns:
        await bound_then_frozen(real, ns, "cut")
        try:
            await asyncio.sleep(2.0)  # kubelet is admitting: the plugin waits for the ledger
            await asyncio.to_thread(cluster.real.restart_kubelet)  # SIGKILL mid-call, then again
            found = await wait_for(phase_of(cluster, ns, "cut", {"Running", "Failed"}), 90, "admitted", 0.1)
        finally:
            os.kill(nats.pid, signal.SIGCONT)
        assert found["status"]["phase"] == "Running", found["status"]
        assert plugin.returncode is None  # the same plugin process served both kubelets
        await wait_for(bound_in_the_ledger(stack, found["metadata"]["uid"]), 60, "bound once NATS is back", 0.5)
