"""Kubelet slots: every card is advertised as 8 device IDs, so a card has at most 8 holders.
Shares spread to the node's other card when one card's slots are used up, and filter never says
"fits" for a node whose cards have no free slot (kube-scheduler's own count of the node's 16
device IDs cannot tell: an exclusive holder takes one ID but blocks its card's other seven)."""

from __future__ import annotations

import asyncio

import pytest

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import SLOTS_PER_CARD, ledger, namespace, pod, running, share

pytestmark = pytest.mark.asyncio(loop_scope="session")

NODE = "p4-2"


async def holders(stack: Stack) -> dict[int, int]:
    node = (await ledger(stack))[NODE]
    found = {card.index: 0 for card in node.node.cards}
    for allocation in node.live():
        for s in allocation.shares():
            found[s.index] += 1
    return found


@pytest.mark.timeout(240)
async def test_shares_spread_when_a_card_runs_out_of_slots(stack: Stack, api: KubeApi) -> None:
    async with namespace(api, "e2e-slots-spread", stack) as ns:
        names = [f"small-{i}" for i in range(SLOTS_PER_CARD + 1)]
        for name in names:
            await api.create(f"/api/v1/namespaces/{ns}/pods", pod(name, ns, share(100), node=NODE))
        await asyncio.gather(*(running(api, ns, name, timeout=120) for name in names))
        found = await holders(stack)
        assert sum(found.values()) == SLOTS_PER_CARD + 1, found
        assert max(found.values()) <= SLOTS_PER_CARD and min(found.values()) >= 1, found


@pytest.mark.timeout(240)
async def test_no_node_fits_when_its_cards_have_no_free_slot(stack: Stack, cluster: RealCluster, api: KubeApi) -> None:
    async with namespace(api, "e2e-slots-full", stack) as ns:
        await api.create(f"/api/v1/namespaces/{ns}/pods", pod("whole", ns, {"gpuledger.io/gpu": "1"}, node=NODE))
        await running(api, ns, "whole")
        names = [f"small-{i}" for i in range(SLOTS_PER_CARD)]
        for name in names:
            await api.create(f"/api/v1/namespaces/{ns}/pods", pod(name, ns, share(100), node=NODE))
        await asyncio.gather(*(running(api, ns, name, timeout=120) for name in names))
        assert sorted((await holders(stack)).values()) == [1, SLOTS_PER_CARD]

        extra = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("one-too-many", ns, share(100), node=NODE))
        outcome = await cluster.outcome(ns, "one-too-many", extra["metadata"]["uid"])
        assert not outcome.node, outcome
        assert "slot" in outcome.pending, outcome.pending
