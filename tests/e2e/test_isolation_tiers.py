"""Isolation tiers on the real control plane: an mps pod and a none pod sent to a node with one
shareable card (rtx-0) do not share it. The second waits, Pending with the scheduler's reason, and
a pod of the first one's tier still joins the card."""

from __future__ import annotations

import pytest

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import ledger, namespace, pod, share

pytestmark = pytest.mark.asyncio(loop_scope="session")

NODE = "rtx-0"
MPS = {"gpuledger.io/isolation": "mps"}


@pytest.mark.timeout(240)
async def test_an_mps_pod_and_a_none_pod_do_not_share_the_one_card(
    stack: Stack, cluster: RealCluster, api: KubeApi
) -> None:
    async with namespace(api, "e2e-tiers", stack) as ns:
        created = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("mps-a", ns, share(1000), MPS, node=NODE))
        first = await cluster.outcome(ns, "mps-a", created["metadata"]["uid"])
        assert first.node == NODE, first
        env = first.env["app"]
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1000M"

        other = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("none-b", ns, share(1000), node=NODE))
        waiting = await cluster.outcome(ns, "none-b", other["metadata"]["uid"])
        assert not waiting.node, waiting
        assert "isolation none does not share a card with mps tenants" in waiting.pending, waiting.pending

        joined = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("mps-c", ns, share(1000), MPS, node=NODE))
        third = await cluster.outcome(ns, "mps-c", joined["metadata"]["uid"])
        assert third.node == NODE, third

        held = (await ledger(stack))[NODE]
        tiers = {a.owner.name: a.isolation.value for a in held.live()}
        assert tiers == {"mps-a": "mps", "mps-c": "mps"}, tiers
