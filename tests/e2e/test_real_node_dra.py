"""DRA mode on a real kubelet: the DRA plugin registers with kubelet v1.36's plugin manager,
kubelet has it prepare each claim, containerd applies the claim's CDI spec, and the container's
own output shows the claim's cards and limits; unprepare after the pod ends removes the spec."""

from __future__ import annotations

import asyncio
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
REAL = "real-p4"
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


async def cleared(stack: Stack, name: str) -> None:
    """The pod and its claim deleted, and the ledger holding nothing of the claim (the next test
    finds both cards free)."""
    cluster = cluster_of(stack)
    assert cluster.api is not None
    await cluster.delete(NAMESPACE, name)
    await cluster.api.delete(f"{CLAIMS}/{name}")

    async def released() -> bool:
        held = [a for a in (await ledger(stack))[REAL].live() if a.owner.name == name]
        return not held

    await wait_for(released, 60, f"the claim {name} released in the ledger", 0.2)


async def minor_of(stack: Stack, uuid: str) -> int:
    node = (await ledger(stack))[REAL].node
    card = next(c for c in node.cards if c.uuid == uuid)
    return card.minor if card.minor is not None else card.index


@pytest.mark.timeout(300)
async def test_a_shared_claim_reaches_the_container_through_kubelet_and_the_runtime(dra_stack: Stack) -> None:
    cluster = cluster_of(dra_stack)
    outcome = await claim_and_run(cluster, "real-share", share(4), REAL)
    assert outcome.node == REAL, outcome
    env, dev = outcome.env["app"], outcome.dev["app"]
    assert env["GPULEDGER_CLAIM"] == f"{NAMESPACE}/real-share"
    assert env["GPULEDGER_MEMORY_LIMIT_MIB"] == str(4 * UNIT_MIB)
    assert env["GPULEDGER_EXCLUSIVE"] == "false"
    uuid = env["NVIDIA_VISIBLE_DEVICES"]
    assert card_nodes(dev) == [f"nvidia{await minor_of(dra_stack, uuid)}"]
    assert {"nvidiactl", "nvidia-uvm"} <= set(dev)
    assert env["HOSTNAME"] == "real-share"  # printed by the container itself
    await cleared(dra_stack, "real-share")


@pytest.mark.timeout(300)
async def test_unprepare_after_the_pod_ends_removes_the_claims_spec(dra_stack: Stack) -> None:
    cluster = cluster_of(dra_stack)
    assert cluster.api is not None and cluster.real is not None
    request, constraints = cards(2)
    outcome = await claim_and_run(cluster, "real-both", request, REAL, constraints)
    assert outcome.node == REAL, outcome
    assert card_nodes(outcome.dev["app"]) == ["nvidia0", "nvidia1"]
    claim = await cluster.api.get(f"{CLAIMS}/real-both")
    spec = next(cluster.real.cdi_dir.glob(f"*{claim['metadata']['uid']}*.json"))
    await cluster.delete(NAMESPACE, "real-both")

    async def removed() -> bool:
        return not spec.exists()

    await wait_for(removed, 60, f"{spec.name} removed by NodeUnprepareResources", 0.2)
    await cleared(dra_stack, "real-both")


def prepared_count(stack: Stack, name: str) -> int:
    """How often the real node's DRA plugin prepared the claim ``name`` (its log says each time)."""
    log = stack.supervisor.run_dir / f"plugin-{REAL}.log"
    said = re.compile(rf"(?<![a-z])prepared ResourceClaim {NAMESPACE}/{re.escape(name)} ")  # not "unprepared"
    return sum(1 for line in log.read_text().splitlines() if said.search(line))


@pytest.mark.timeout(300)
async def test_a_kubelet_restart_prepares_nothing_twice_and_keeps_the_container(dra_stack: Stack) -> None:
    cluster = cluster_of(dra_stack)
    assert cluster.api is not None and cluster.real is not None
    await claim_and_run(cluster, "real-kept", share(4), REAL)
    assert prepared_count(dra_stack, "real-kept") == 1
    found = await cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/real-kept")
    running_as = found["status"]["containerStatuses"][0]["containerID"]

    await asyncio.to_thread(cluster.real.restart_kubelet)
    after = await claim_and_run(cluster, "real-after", share(4), REAL)  # kubelet and plugin at work again
    assert after.node == REAL and after.env["app"]["GPULEDGER_CLAIM"] == f"{NAMESPACE}/real-after"
    found = await cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/real-kept")
    status = found["status"]["containerStatuses"][0]
    assert status["containerID"] == running_as and status["restartCount"] == 0
    assert prepared_count(dra_stack, "real-kept") == 1
    await cleared(dra_stack, "real-after")
    await cleared(dra_stack, "real-kept")


@pytest.mark.timeout(300)
async def test_a_claim_the_ledger_refused_never_reaches_a_running_container(dra_stack: Stack) -> None:
    """A tool holds both cards in the ledger; a pod is put on the real node by hand with a claim
    allocated by hand to one of them (as a scheduler that does not wait for the ledger would). The
    claims controller's record is refused, so kubelet's NodePrepareResources is refused by the DRA
    plugin: the pod stays Pending with kubelet's event naming the reason, no container starts and
    no CDI spec is written."""
    cluster = cluster_of(dra_stack)
    assert cluster.api is not None and cluster.real is not None
    api = cluster.api
    async with allocator(dra_stack.grpc) as stub:
        held = [(await stub.allocate(tool_request(REAL, i))).allocation.id for i in range(2)]
    (found,) = (await api.get(SLICES, fieldSelector=f"spec.nodeName={REAL},spec.driver={DRIVER}"))["items"]
    pool, device = found["spec"]["pool"]["name"], found["spec"]["devices"][0]["name"]
    whole = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    await api.create(CLAIMS, {"metadata": {"name": "real-refused"}, "spec": {"devices": {"requests": [whole]}}})
    body = {
        "metadata": {"name": "real-refused", "namespace": NAMESPACE},
        "spec": reporting({
            "nodeName": REAL,
            "containers": [{"name": "app", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "real-refused"}],
        }),
    }  # fmt: skip
    created = await api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)
    claim = await api.get(f"{CLAIMS}/real-refused")
    result = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
    claim["status"] = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": "real-refused", "uid": created["metadata"]["uid"]}],
    }
    await api.call("PUT", f"{CLAIMS}/real-refused/status", claim)
    uid = created["metadata"]["uid"]

    async def refused() -> dict[str, Any] | None:
        found = await api.get(
            f"/api/v1/namespaces/{NAMESPACE}/events", fieldSelector=f"involvedObject.uid={uid},reason={FAILED_PREPARE}"
        )  # kubelet may first have found the claim not yet reserved for the pod: a refusal of its own
        return next((e for e in found.get("items") or [] if "holds no entry for it" in e["message"]), None)

    try:
        event = await wait_for(refused, 90, "kubelet's event for the claim the ledger refused", 0.5)
        assert "NodePrepareResources failed for ResourceClaim real-refused" in event["message"], event["message"]
        await asyncio.sleep(5.0)  # kubelet tries again: still refused
        pod = await api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/real-refused")
        assert pod["status"]["phase"] == "Pending", pod["status"]
        assert not any("running" in s.get("state", {}) for s in pod["status"].get("containerStatuses", []))
        assert not list(cluster.real.cdi_dir.glob(f"*{claim['metadata']['uid']}*.json"))
        assert prepared_count(dra_stack, "real-refused") == 0
        assert not [a for a in (await ledger(dra_stack))[REAL].live() if a.owner.name == "real-refused"]
    finally:
        await cleared(dra_stack, "real-refused")
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
