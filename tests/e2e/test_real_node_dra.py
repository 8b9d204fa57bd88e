"""DRA mode on a real kubelet, and the same assertions on the simulated one beside it.

The DRA plugin registers with kubelet v1.36's plugin manager, kubelet has it prepare each claim,
containerd applies the claim's CDI spec, and the container's own output shows the claim's cards
and limits; unprepare after the pod ends removes the spec; a kubelet restart prepares nothing
twice; a claim the ledger refused never runs. Each test runs on both nodes of the fleet:
``real-p4`` (kubelet and containerd) and ``kwok-p4`` (the simulated kubelet's DRA side, whose
container environments come from the CDI specs of their claims), so the simulation is held to
the real kubelet by the same assertions."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpuledger_common.allocator_client import allocator
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.kwok_dra_claims import FAILED_PREPARE
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import DRIVER, NAMESPACE, RealCluster, reporting
from gpuledger_dev.scenario import UNIT_MIB
from gpuledger_dev.scenario_dra import CLAIMS, cards, claim_and_run, share
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.e2e.helpers import card_nodes, ledger
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

FLEET = Path(__file__).with_name("real_fleet.yaml")
REAL, KWOK = "real-p4", "kwok-p4"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def dra_stack() -> AsyncIterator[Stack]:
    fleet = load_fleet(FLEET)
    async with running_stack(fleet, free_port(), free_port(), _say, "real", "dra", real_node=REAL) as stack:
        yield stack


def _say(message: str) -> None:
    print(f"[real-node DRA stack] {message}", flush=True)


def cluster_of(stack: Stack) -> RealCluster:
    assert isinstance(stack.cluster, RealCluster) and stack.cluster.api is not None
    return stack.cluster


@pytest.fixture(params=[REAL, KWOK], ids=["real-kubelet", "simulated-kubelet"])
def node(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def named(node: str, name: str) -> str:
    """A pod's and its claim's name on ``node`` (each node's run leaves nothing for the next)."""
    return f"{'real' if node == REAL else 'kwok'}-{name}"


async def cleared(stack: Stack, name: str, node: str) -> None:
    """The pod and its claim deleted, and the ledger holding nothing of the claim (the next test
    finds both cards free)."""
    cluster = cluster_of(stack)
    assert cluster.api is not None
    await cluster.delete(NAMESPACE, name)
    await cluster.api.delete(f"{CLAIMS}/{name}")

    async def released() -> bool:
        held = [a for a in (await ledger(stack))[node].live() if a.owner.name == name]
        return not held

    await wait_for(released, 60, f"the claim {name} released in the ledger", 0.2)


async def minor_of(stack: Stack, uuid: str) -> int:
    cards_of = (await ledger(stack))[REAL].node
    card = next(c for c in cards_of.cards if c.uuid == uuid)
    return card.minor if card.minor is not None else card.index


@pytest.mark.timeout(300)
async def test_a_shared_claim_reaches_the_container_through_kubelet_and_the_runtime(
    dra_stack: Stack, node: str
) -> None:
    cluster, name = cluster_of(dra_stack), named(node, "share")
    outcome = await claim_and_run(cluster, name, share(4), node)
    assert outcome.node == node, outcome
    env = outcome.env["app"]
    assert env["GPULEDGER_CLAIM"] == f"{NAMESPACE}/{name}"
    assert env["GPULEDGER_MEMORY_LIMIT_MIB"] == str(4 * UNIT_MIB)
    assert env["GPULEDGER_EXCLUSIVE"] == "false"
    if node == REAL:  # what the container printed itself
        dev = outcome.dev["app"]
        assert card_nodes(dev) == [f"nvidia{await minor_of(dra_stack, env['NVIDIA_VISIBLE_DEVICES'])}"]
        assert {"nvidiactl", "nvidia-uvm"} <= set(dev)
        assert env["HOSTNAME"] == name
    await cleared(dra_stack, name, node)


@pytest.mark.timeout(300)
async def test_unprepare_after_the_pod_ends_removes_the_claims_spec(dra_stack: Stack, node: str) -> None:
    cluster, name = cluster_of(dra_stack), named(node, "both")
    assert cluster.api is not None
    request, constraints = cards(2)
    outcome = await claim_and_run(cluster, name, request, node, constraints)
    assert outcome.node == node, outcome
    if node == REAL:
        assert card_nodes(outcome.dev["app"]) == ["nvidia0", "nvidia1"]
    claim = await cluster.api.get(f"{CLAIMS}/{name}")
    spec = next(cluster.cdi_dir(node).glob(f"*{claim['metadata']['uid']}*.json"))
    await cluster.delete(NAMESPACE, name)

    async def removed() -> bool:
        return not spec.exists()

    await wait_for(removed, 60, f"{spec.name} removed by NodeUnprepareResources", 0.2)
    await cleared(dra_stack, name, node)


def prepared_count(stack: Stack, node: str, name: str) -> int:
    """How often ``node``'s DRA plugin prepared the claim ``name`` (its log says each time)."""
    log = stack.supervisor.run_dir / f"plugin-{node}.log"
    said = re.compile(rf"(?<![a-z])prepared ResourceClaim {NAMESPACE}/{re.escape(name)} ")  # not "unprepared"
    return sum(1 for line in log.read_text().splitlines() if said.search(line))


async def restart_kubelet(cluster: RealCluster, node: str) -> None:
    """Kill kubelet and start it again (the simulated one: as kubelet restarts), and wait until the
    node's ResourceSlices, which kubelet deletes as it starts, are published again: until then
    kube-scheduler finds no device there (and a pod created meanwhile is reported unschedulable)."""
    before = await slice_uids(cluster, node)
    if node == REAL:
        assert cluster.real is not None
        await asyncio.to_thread(cluster.real.restart_kubelet)
    else:
        await cluster.kubelets[node].restart()

    async def published_again() -> bool:
        found = await slice_uids(cluster, node)
        return bool(found) and not found & before

    await wait_for(published_again, 60, f"the ResourceSlices of {node} deleted by kubelet and published again", 0.2)


async def slice_uids(cluster: RealCluster, node: str) -> set[str]:
    assert cluster.api is not None
    found = await cluster.api.get(SLICES, fieldSelector=f"spec.nodeName={node},spec.driver={DRIVER}")
    return {s["metadata"]["uid"] for s in found["items"]}


async def container_of(cluster: RealCluster, name: str) -> tuple[str, int]:
    """The pod's container ID and restart count (the simulated kubelet runs none: empty)."""
    assert cluster.api is not None
    found = await cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    statuses = found["status"].get("containerStatuses") or [{}]
    return statuses[0].get("containerID", ""), statuses[0].get("restartCount", 0)


@pytest.mark.timeout(300)
async def test_a_kubelet_restart_prepares_nothing_twice_and_keeps_the_container(dra_stack: Stack, node: str) -> None:
    cluster, kept, after = cluster_of(dra_stack), named(node, "kept"), named(node, "after")
    await claim_and_run(cluster, kept, share(4), node)
    assert prepared_count(dra_stack, node, kept) == 1
    running_as = await container_of(cluster, kept)
    assert bool(running_as[0]) == (node == REAL)

    await restart_kubelet(cluster, node)
    started = await claim_and_run(cluster, after, share(4), node)  # kubelet and plugin at work again
    assert started.node == node, started
    assert started.env["app"]["GPULEDGER_CLAIM"] == f"{NAMESPACE}/{after}"
    assert await container_of(cluster, kept) == running_as  # the same container, never restarted
    assert prepared_count(dra_stack, node, kept) == 1
    await cleared(dra_stack, after, node)
    await cleared(dra_stack, kept, node)


@pytest.mark.timeout(300)
async def test_a_claim_the_ledger_refused_never_reaches_a_running_container(dra_stack: Stack, node: str) -> None:
    """A tool holds both cards in the ledger; a pod is put on the node by hand with a claim
    allocated by hand to one of them (as a scheduler that does not wait for the ledger would). The
    claims controller's record is refused, so kubelet's NodePrepareResources is refused by the DRA
    plugin: the pod stays Pending with kubelet's event naming the reason, no container starts and
    no CDI spec is written."""
    cluster, name = cluster_of(dra_stack), named(node, "refused")
    assert cluster.api is not None
    api = cluster.api
    async with allocator(dra_stack.grpc) as stub:
        held = [(await stub.allocate(tool_request(node, i))).allocation.id for i in range(2)]
    (found,) = (await api.get(SLICES, fieldSelector=f"spec.nodeName={node},spec.driver={DRIVER}"))["items"]
    pool, device = found["spec"]["pool"]["name"], found["spec"]["devices"][0]["name"]
    whole = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    await api.create(CLAIMS, {"metadata": {"name": name}, "spec": {"devices": {"requests": [whole]}}})
    body = {
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": reporting({
            "nodeName": node,
            "containers": [{"name": "app", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        }),
    }  # fmt: skip
    created = await api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)
    uid = created["metadata"]["uid"]
    claim = await api.get(f"{CLAIMS}/{name}")
    result = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
    claim["status"] = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": uid}],
    }
    await api.call("PUT", f"{CLAIMS}/{name}/status", claim)

    async def refused() -> dict[str, Any] | None:
        found = await api.get(
            f"/api/v1/namespaces/{NAMESPACE}/events", fieldSelector=f"involvedObject.uid={uid},reason={FAILED_PREPARE}"
        )  # kubelet may first have found the claim not yet reserved for the pod: a refusal of its own
        return next((e for e in found.get("items") or [] if "holds no entry for it" in e["message"]), None)

    try:
        event = await wait_for(refused, 90, "kubelet's event for the claim the ledger refused", 0.5)
        assert f"NodePrepareResources failed for ResourceClaim {name}" in event["message"], event["message"]
        await asyncio.sleep(5.0)  # kubelet tries again: still refused
        pod = await api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        assert pod["status"]["phase"] == "Pending", pod["status"]
        assert not any("running" in s.get("state", {}) for s in pod["status"].get("containerStatuses", []))
        assert not list(cluster.cdi_dir(node).glob(f"*{claim['metadata']['uid']}*.json"))
        assert prepared_count(dra_stack, node, name) == 0
        assert not [a for a in (await ledger(dra_stack))[node].live() if a.owner.name == name]
    finally:
        await cleared(dra_stack, name, node)
        async with allocator(dra_stack.grpc) as stub:
            for allocation_id in held:
                await stub.release(pb.ReleaseRequest(allocation_id=allocation_id))


def tool_request(node: str, i: int) -> pb.AllocateRequest:
    """One whole card of ``node`` for a tool outside Kubernetes, committed."""
    return pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id=f"batch/job-{i}"),
        containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1))],
        commit=True,
        node=node,
    )


def kubelet_log(cluster: RealCluster) -> list[str]:
    """The real kubelet's log so far (every start of it appends to one file)."""
    assert cluster.real is not None
    return (cluster.real.root / "logs" / "kubelet.log").read_text(errors="replace").splitlines()


@pytest.mark.timeout(300)
async def test_kubelet_shows_a_running_pods_device_health_from_the_plugins_stream(dra_stack: Stack) -> None:
    """The real kubelet only (the simulated one asks no health): kubelet keeps the DRA plugin's
    NodeWatchResources stream open, never logs an error of it, and shows the health the plugin
    sends of the pod's device in the container's ``allocatedResourcesStatus``."""
    cluster, name = cluster_of(dra_stack), named(REAL, "health")
    assert cluster.api is not None
    api = cluster.api
    outcome = await claim_and_run(cluster, name, share(4), REAL)
    assert outcome.node == REAL, outcome
    claim = await api.get(f"{CLAIMS}/{name}")
    spec = json.loads(next(cluster.cdi_dir(REAL).glob(f"*{claim['metadata']['uid']}*.json")).read_text())
    (device,) = spec["devices"]

    async def shown() -> list[dict[str, Any]] | None:
        pod = await api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        statuses = pod["status"].get("containerStatuses") or [{}]
        found: list[dict[str, Any]] | None = statuses[0].get("allocatedResourcesStatus")
        return found

    try:
        found = await wait_for(shown, 60, "kubelet showing the claim's device health", 0.5)
        resource = {"resourceID": f"{spec['kind']}={device['name']}", "health": "Healthy"}
        assert found == [{"name": "claim:gpu", "resources": [resource]}], found
        lines = kubelet_log(cluster)
        assert [line for line in lines if "Successfully started WatchResources health stream" in line]
        assert not [line for line in lines if "WatchResources" in line and line.startswith("E")]
        assert not [line for line in lines if "WatchResources health stream has ended" in line]
    finally:
        await cleared(dra_stack, name, REAL)
