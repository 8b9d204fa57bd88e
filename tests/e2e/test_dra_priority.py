"""Mode C gives room to the pod of highest priority first, as kube-scheduler's queue does
(docs/dra-mode-c.md, "Priority"), on the real control plane: a node's two cards each hold a 5 GiB
claim of high priority; four low-priority pods, then one high-priority pod, each wait with a 5 GiB
claim that fits nowhere (none may preempt: nothing below them holds a card they could use). One
card is freed: the high-priority pod takes it, the low-priority ones keep waiting, and nobody is
evicted."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from gpuledger_dev.controlplane.cluster import ControlPlane
from gpuledger_dev.natsserver import NatsServer
from tests.e2e.dra_helpers import CLAIMS, claimed_pod, share_claim
from tests.e2e.dra_ledger import bound as pod_bound
from tests.e2e.dra_ledger import claim_entry, gated_world
from tests.e2e.helpers import HIGH, LOW, priority_classes
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]
WAITING = ("low-0", "low-1", "low-2", "low-3")


async def test_a_freed_card_goes_to_the_waiting_pod_of_highest_priority(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Any
) -> None:
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        api, ns, node = world.api, world.ns, world.node.name
        pods, claims_path = f"/api/v1/namespaces/{ns}/pods", CLAIMS.format(ns=ns)
        await api.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuledger.io/allocation": "ledger"}}})
        async with priority_classes(api):
            kept = {}
            for name in ("keep-0", "keep-1"):  # 5 GiB of a 7.5 GiB card each: one on each card
                made = await api.create(claims_path, share_claim(name, "5Gi", "10"))
                await api.create(pods, claimed_pod(name, name, HIGH))
                await pod_bound(api, ns, name)
                kept[name] = made["metadata"]["uid"]

            async def refused(name: str) -> bool:
                events = f"/api/v1/namespaces/{ns}/events"
                found = await api.get(events, fieldSelector="reason=GpuledgerUnschedulable")
                return any(e["involvedObject"]["name"] == name for e in found["items"])

            for name in (*WAITING, "high"):
                await api.create(claims_path, share_claim(name, "5Gi", "10"))
                await api.create(pods, claimed_pod(name, name, LOW if name in WAITING else HIGH))
            for name in (*WAITING, "high"):
                await wait_for(functools.partial(refused, name), 60, f"pod {name} refused: no room", 0.2)
            await asyncio.sleep(6)  # every waiting pod well into its back-off (up to 5 s between tries)

            await api.delete(f"{pods}/keep-0", grace_s=0)
            await api.delete(f"{claims_path}/keep-0")
            high = await pod_bound(api, ns, "high", timeout=60)
            assert high["spec"]["nodeName"] == node
            await asyncio.sleep(3)  # what a low-priority pod that took the card would have shown by now
            left = {p["metadata"]["name"]: p for p in (await api.get(pods))["items"]}
            assert set(left) == {"keep-1", "high", *WAITING}  # nobody evicted
            for name in WAITING:
                assert not left[name]["spec"].get("nodeName") and left[name]["spec"].get("schedulingGates"), name
                assert (await api.get(f"{claims_path}/{name}")).get("status", {}).get("allocation") is None, name
            events = (await api.get(f"/api/v1/namespaces/{ns}/events", fieldSelector="reason=Preempted"))["items"]
            assert events == []
            assert await claim_entry(nats_server, node, kept["keep-1"]) is not None
