"""A burst of 200 DRA claims through the real kube-scheduler onto four DRA nodes (8 H100 each), the
claims controller deciding every one: afterwards every pod is bound, every claim is committed, no
card is over capacity (memory, compute, slots), and the ledger's claim entries are exactly the
claims' allocations, card for card. Then deleting them all leaves no claim entry behind."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuledger_core.model import OwnerKind
from gpuledger_dev.controlplane.cluster import ControlPlane, plain_scheduler_config
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.slices import DRIVER
from tests.e2e.dra_helpers import CLAIMS, SCHEDULER, ensure_device_class, namespace, published, share_claim
from tests.e2e.dra_ledger import COMMITTED, conditions, gated_node, ledger_of, ledger_side
from tests.support.ledger_check import check
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(420), pytest.mark.asyncio(loop_scope="session")]
CLAIMS_N = 200
NODES = 4
SLOTS = 8


def in_ledger(server: NatsServer, node: str) -> Callable[[], Awaitable[object]]:
    return lambda: ledger_of(server, node)


async def summary(api: Any, ns: str) -> str:
    """How far the burst got: pods bound, claims by their conditions, the last scheduling messages."""
    pods = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
    claims = (await api.get(CLAIMS.format(ns=ns)))["items"]
    states: dict[str, int] = {}
    for claim in claims:
        found = conditions(claim)
        key = ",".join(sorted(found)) or ("allocated" if claim.get("status", {}).get("allocation") else "pending")
        states[key] = states.get(key, 0) + 1
    messages = {
        c.get("message", "")[:200]
        for p in pods
        if not p["spec"].get("nodeName")
        for c in p.get("status", {}).get("conditions", [])
        if c.get("type") == "PodScheduled"
    }
    bound = sum(1 for p in pods if p["spec"].get("nodeName"))
    return f"bound {bound}/{len(pods)}; claims {states}; unscheduled pods say {sorted(messages)[:5]}"


def pod(name: str, claim: str) -> dict[str, Any]:
    """A pod of the claim, on any node kube-scheduler likes."""
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "app", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


async def test_a_burst_of_200_claims_is_decided_by_the_ledger_with_no_card_over_capacity(
    control_plane: ControlPlane,
    nats_server: NatsServer,
    placement_kubeconfig: Path,
) -> None:
    await asyncio.to_thread(control_plane.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(ledger_side(nats_server, placement_kubeconfig))
        nodes = []
        for _ in range(NODES):  # 64 pods each: room for the burst
            nodes.append(await stack.enter_async_context(gated_node(control_plane, nats_server, "h100-sxm-8", pods=64)))
        api = nodes[0].api
        ns = await stack.enter_async_context(namespace(api, f"burst-{nodes[0].name}"))
        for node in nodes:
            await published(node)
            await wait_for(in_ledger(nats_server, node.name), 30, f"{node.name} in the ledger", 0.2)
        await ensure_device_class(api)
        started = time.monotonic()
        for i in range(CLAIMS_N):  # 10 GiB and 10 % each: 8 per card by slots, 256 places for 200
            await api.create(CLAIMS.format(ns=ns), share_claim(f"c{i}", "10Gi", "10"))
            await api.create(f"/api/v1/namespaces/{ns}/pods", pod(f"p{i}", f"c{i}"))

        async def all_bound() -> bool:
            found = await api.get(f"/api/v1/namespaces/{ns}/pods")
            return sum(1 for p in found["items"] if p["spec"].get("nodeName")) == CLAIMS_N

        try:
            await wait_for(all_bound, 300, f"all {CLAIMS_N} pods bound", 1.0)
        except TimeoutError:
            print(await summary(api, ns))
            raise
        took = time.monotonic() - started
        print(f"\n  {CLAIMS_N} claims created and their pods bound in {took:.1f}s ({CLAIMS_N / took:.1f} pods/s)")

        claims = (await api.get(CLAIMS.format(ns=ns)))["items"]
        assert len(claims) == CLAIMS_N
        assert all(conditions(c).get(COMMITTED, {}).get("status") == "True" for c in claims)
        ledgers = {n.name: await ledger_of(nats_server, n.name) for n in nodes}
        assert all(ledger is not None for ledger in ledgers.values())
        report = check([ledger for ledger in ledgers.values() if ledger is not None], [], SLOTS, time.time())
        assert report.findings == [], report.findings
        held = {
            a.owner.id: (node, sorted(s.uuid for s in a.shares()))
            for node, ledger in ledgers.items()
            if ledger is not None
            for a in ledger.live()
            if a.owner.kind is OwnerKind.CLAIM
        }
        wanted = {}
        for claim in claims:
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            ledger = ledgers[result["pool"]]
            assert ledger is not None and result["driver"] == DRIVER
            card = next(c for c in ledger.node.cards if f"gpu-{c.index}" == result["device"])
            wanted[claim["metadata"]["uid"]] = (result["pool"], [card.uuid])
        assert held == wanted

        await api.call("DELETE", f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": "0"})
        await api.call("DELETE", CLAIMS.format(ns=ns))

        async def none_left() -> bool:
            for node in nodes:
                ledger = await ledger_of(nats_server, node.name)
                if ledger is not None and any(a.owner.kind is OwnerKind.CLAIM for a in ledger.live()):
                    return False
            return True

        await wait_for(none_left, 120, "every claim's entry released", 1.0)
