"""The demo scenario of `gpuledger dev up`, on the real control plane: every pod created through
kube-apiserver, scheduled by kube-scheduler through gpuledger's extender, admitted by the node's
kubelet (Allocate from the plugin shim) and turned Running by kwok; then looked at with kubectl,
as a user of `dev up --kubernetes real` would. The MIG step's instances are checked in the ledger:
made on demand by the node's inventory, or of the operator's static layout."""

from __future__ import annotations

import re

import pytest

from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from gpuledger_dev.scenario import run_scenario
from gpuledger_dev.scenario_mig import NODE as MIG_NODE
from tests.e2e.helpers import ledger
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")
MIG_LINE = re.compile(r"ok +(mig-\S+) on \S+: (\S+@\d+) as (MIG-\S+)$")


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
    await _mig_instances(stack, cluster, said)


async def _mig_instances(stack: Stack, cluster: RealCluster, said: list[str]) -> None:
    """The MIG step's instances as the node's inventory reports them to the ledger: the 1g.5gb is
    one of card 2's static layout, the others were made on demand, each the device its pod got."""
    given = {m[1]: (m[2], m[3]) for m in map(MIG_LINE.search, said) if m}
    assert set(given) == {"mig-1g", "mig-4g", "mig-8000"}, said
    node = (await ledger(stack))[MIG_NODE].node
    instances = {i.uuid: (card.index, i) for card in node.cards for i in card.instances}
    for pod, (where, uuid) in given.items():
        card, instance = instances[uuid]
        assert f"{instance.slot.profile}@{instance.slot.start}" == where
        assert instance.static is (pod == "mig-1g") and (card == 2) is (pod == "mig-1g"), (pod, card, instance)
    waiting = cluster.control_plane.kubectl("describe", "pod", "-n", "demo", "mig-7g-2").stdout
    assert "FailedScheduling" in waiting and "no free placement of MIG 7g.40gb" in waiting, waiting
