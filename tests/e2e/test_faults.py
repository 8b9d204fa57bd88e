"""Faults in the middle of a burst of 200 GPU pods through kube-scheduler and the extender: SIGKILL
of the allocator, of placement and of nats-server (each restarted, as Kubernetes would restart
it), and a restart of a node's kubelet. Afterwards every pod is Running or Pending with a reason,
no card is over capacity, the ledger equals what the pods hold, and every pod that fits runs:
the three nodes' 24 cards take 192 one-card shares (8 kubelet slots each), so 192 pods run and 8
wait, but after the kubelet restart, where the pods kubelet refused hold nothing and the pods
that waited take their room: min(192, 200 - refused) run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import POLL_S, SLOTS_PER_CARD, consistent, namespace, pod, pods_in, share, steady
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

BURST = 200
NODES = ("a100-0", "a100-1", "v100-0")  # 24 cards x 8 slots: room for 192 one-card shares
SETTLED_S = 240.0
Fault = Callable[[Stack, RealCluster], Awaitable[None]]


async def kill_allocator(stack: Stack, _: RealCluster) -> None:
    await stack.supervisor.kill("allocator")
    await stack.supervisor.restart("allocator")


async def kill_placement(stack: Stack, _: RealCluster) -> None:
    await stack.supervisor.kill("placement")
    await stack.supervisor.restart("placement")


async def kill_nats(stack: Stack, _: RealCluster) -> None:
    await stack.nats.kill()
    await stack.nats.start()


async def restart_kubelet(_: Stack, cluster: RealCluster) -> None:
    await cluster.kubelets["a100-0"].restart()


# What kubelet itself may refuse after the fault. A restarted kubelet refuses new pods that want a
# device plugin's resource until that plugin has registered again ("no healthy devices present",
# kubernetes#109595): kubelet's behaviour, not the ledger's; those pods end Failed and their cards
# must come back.
EXPECTED_REFUSALS = {"kubelet-restart": "no healthy devices present"}

FAULTS: dict[str, Fault] = {
    "allocator-sigkill": kill_allocator,
    "placement-sigkill": kill_placement,
    "nats-server-sigkill": kill_nats,
    "kubelet-restart": restart_kubelet,
}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_fault_mid_burst_leaves_the_ledger_equal_to_the_pods_and_every_pod_that_fits_running(
    stack: Stack, cluster: RealCluster, api: KubeApi, fleet: Fleet, fault: str
) -> None:
    room = sum(len(m.node.cards) for m in fleet.nodes if m.node.name in NODES) * SLOTS_PER_CARD
    assert room == 192 < BURST  # the fleet the test is written for: some pods must wait
    async with namespace(api, f"e2e-burst-{fault}", stack) as ns:
        pods = [pod(f"burst-{i:03d}", ns, share(1000)) for i in range(BURST)]
        for body in pods:
            body["spec"]["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In", "values": list(NODES)}
                                ]
                            }
                        ]
                    }
                }
            }
        creating = asyncio.ensure_future(_create_all(api, ns, pods))
        await wait_for(lambda: _bound_at_least(api, ns, BURST // 4), 120, f"{BURST // 4} pods bound", POLL_S)
        await FAULTS[fault](stack, cluster)
        await creating
        await wait_for(
            _steady(cluster, api, ns), SETTLED_S, "every pod Running or Pending with a reason, for good", interval=1.0
        )
        after = await pods_in(api, ns)
        expected = EXPECTED_REFUSALS.get(fault)
        refused = [
            f"{p['metadata']['name']}: {p['status'].get('message')}"
            for p in after
            if p["status"].get("phase") == "Failed"
        ]
        unexpected = [r for r in refused if expected is None or expected not in r]
        assert not unexpected, f"kubelet refused pods the ledger placed, after {fault}: {unexpected[:5]}"
        print(f"{fault}: {len(refused)} pod(s) refused by kubelet at admission", flush=True)
        report = await consistent(cluster, stack)
        stack.supervisor.check()
        running = sum(1 for p in after if p["status"].get("phase") == "Running")
        must = min(room, BURST - len(refused))  # a refused pod holds no card: a waiting one takes its room
        waiting = [_why_waiting(p) for p in after if p["status"].get("phase") == "Pending"]
        assert running == must, (
            f"{running} of {BURST} pods run after {fault}, {must} must ({len(refused)} refused by kubelet, "
            f"{len(waiting)} pending, e.g. {waiting[:3]}): {report}"
        )


def _why_waiting(found: dict[str, Any]) -> str:
    conditions = found["status"].get("conditions") or []
    said = [c.get("message", "") for c in conditions if c.get("type") == "PodScheduled"]
    return f"{found['metadata']['name']} on {found['spec'].get('nodeName') or 'no node'}: {said[0] if said else '?'}"


async def _create_all(api: KubeApi, ns: str, pods: list[dict[str, object]]) -> None:
    for body in pods:
        await api.create(f"/api/v1/namespaces/{ns}/pods", body)


async def _bound_at_least(api: KubeApi, ns: str, count: int) -> bool:
    return sum(1 for p in await pods_in(api, ns) if p["spec"].get("nodeName")) >= count


def _steady(cluster: RealCluster, api: KubeApi, ns: str) -> Callable[[], Awaitable[bool]]:
    async def running_if_settled() -> int | None:
        if not await _settled(cluster, api, ns):
            return None
        return sum(1 for p in await pods_in(api, ns) if p["status"].get("phase") == "Running")

    return steady(running_if_settled)


async def _settled(cluster: RealCluster, api: KubeApi, ns: str) -> bool:
    """Every pod Running (or refused by its kubelet), or unbound with a FailedScheduling event saying why."""
    for found in await pods_in(api, ns):
        phase, node = found["status"].get("phase"), found["spec"].get("nodeName")
        if phase in ("Running", "Failed"):
            continue
        if phase == "Pending" and not node:
            meta = found["metadata"]
            if await cluster.scheduling_failure(ns, meta["name"], meta["uid"]):
                continue
        return False
    return True
