"""The demo scenario of `gpuledger dev up`, on the real control plane: every pod created through
kube-apiserver, scheduled by kube-scheduler through gpuledger's extender, admitted by the node's
kubelet (Allocate from the plugin shim) and turned Running by kwok; then looked at with kubectl,
as a user of `dev up --kubernetes real` would."""

from __future__ import annotations

import pytest

from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from gpuledger_dev.scenario import run_scenario
from tests.e2e.helpers import ledger
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.timeout(300)
async def test_demo_scenario_on_the_real_control_plane(stack: Stack, cluster: RealCluster) -> None:
    try:
        await _demo(stack, cluster)
    finally:  # the demo's pods go: the next tests find the cards free
        await _delete_pods_of(stack, cluster, "demo")


async def _delete_pods_of(stack: Stack, cluster: RealCluster, ns: str) -> None:
    assert cluster.api is not None
    await cluster.api.call("DELETE", f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": "0"})

    async def released() -> bool:
        return not any(a.owner.namespace == ns for found in (await ledger(stack)).values() for a in found.live())

    await wait_for(released, 60, f"every card held in namespace {ns} released", interval=0.5)


async def _demo(stack: Stack, cluster: RealCluster) -> None:
    said: list[str] = []
    assert await run_scenario(stack, said.append), "\n".join(said)
    assert any("stays pending" in line for line in said), said

    wide = cluster.control_plane.kubectl("get", "pods", "-n", "demo", "-o", "wide").stdout
    assert "app-a" in wide and "Running" in wide and "rtx-0" in wide, wide
    described = cluster.control_plane.kubectl("describe", "pod", "-n", "demo", "app-c-10").stdout
    assert "FailedScheduling" in described and "MiB short of" in described, described
    annotated = cluster.control_plane.kubectl("describe", "pod", "-n", "demo", "train-4").stdout
    assert "gpuledger.io/allocation" in annotated, annotated
