"""Placement killed in the middle of a preemption, on the real control plane (docs/preemption.md,
"Faults"): the scene of test_preemption.py (a high-priority 5 GiB share on a node whose two cards are
full of low-priority 2-4 GiB shares), with placement SIGKILLed while the room is held for the pod
and it is not bound yet. The low pods carry a finalizer of the test's, so that an evicted one stays
(terminating) until the test lets it go: the pod's bind waits for its victims to be gone, which
keeps the preemption in the middle for as long as the test needs.

- ``restarted``: placement comes back; the pod binds into the room held for it, and the pods
  evicted are one smallest set on one card, each evicted once (one ``Preempted`` Event each):
  the new placement does not preempt again.
- ``pod deleted``: the pod is deleted while placement is down; the room held for it is released
  (no half-held room), and once placement is back a second pod of the same size and priority
  takes that room without evicting anybody more.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gpuledger_core.model import AllocState
from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import (
    HIGH,
    LOW,
    POLL_S,
    consistent,
    get_pod,
    ledger,
    namespace,
    pods_in,
    priority_classes,
    released,
    running,
    smallest_sets,
)
from tests.e2e.test_preemption import NODE, SHARES, WANT, prioritized
from tests.support.card_repair import Read, ledger_reader
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _held_for(read: Read, uid: str) -> bool:
    """The ledger holds a reservation of ``NODE``'s cards for the pod (the preemption's hold)."""
    found = next((n for n in await read() if n.node.name == NODE), None)
    return found is not None and any(a.owner.id == uid and a.state is AllocState.RESERVED for a in found.live())


async def _preempted(api: KubeApi, ns: str) -> list[str]:
    """The pods a ``Preempted`` Event names, once per Event (an eviction told twice shows twice)."""
    events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
    return sorted(e["involvedObject"]["name"] for e in events if e.get("reason") == "Preempted")


async def _left(api: KubeApi, ns: str) -> set[str]:
    return {p["metadata"]["name"] for p in await pods_in(api, ns) if not p["metadata"].get("deletionTimestamp")}


KEPT = "e2e.gpuledger.io/kept"  # the low pods' finalizer: an evicted one stays until it is removed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("after", ["restarted", "pod deleted"])
async def test_placement_killed_mid_preemption_leaves_no_half_held_room_and_evicts_nobody_twice(
    stack: Stack, cluster: RealCluster, api: KubeApi, after: str
) -> None:
    async def node_idle() -> bool:
        found = (await ledger(stack)).get(NODE)
        return found is not None and not list(found.live())

    await wait_for(node_idle, 60, f"{NODE}'s cards held by nobody (an earlier test's pods gone)", POLL_S)
    name = f"e2e-preemption-{after.replace(' ', '-')}"
    reader = ledger_reader(stack.nats_url, stack.operator)
    async with priority_classes(api), namespace(api, name, stack) as ns, reader as read:
        pods = f"/api/v1/namespaces/{ns}/pods"
        uids: dict[str, str] = {}
        try:
            for i, mib in enumerate(SHARES):
                body = prioritized(f"low-{i}", ns, mib, LOW)
                body["metadata"]["finalizers"] = [KEPT]
                made = await api.create(pods, body)
                await running(api, ns, f"low-{i}")
                uids[made["metadata"]["uid"]] = f"low-{i}"
            expected = smallest_sets((await ledger(stack))[NODE], uids, WANT)

            high = await api.create(pods, prioritized("high", ns, WANT, HIGH))
            uid = high["metadata"]["uid"]
            await wait_for(lambda: _held_for(read, uid), 60, "the room held for pod high", POLL_S)
            await stack.supervisor.kill("placement")
            bound = (await get_pod(api, ns, "high"))["spec"].get("nodeName")
            assert not bound, f"pod high was bound to {bound} while its victims were still there"
            if after == "pod deleted":
                await api.delete(f"{pods}/high")
                await released(stack, uid, timeout=60)  # the hold goes with its pod, placement down
            await stack.supervisor.restart("placement")
            await _let_go(api, ns)
            waited = "high" if after == "restarted" else await _again(api, pods, ns)
            placed = await running(api, ns, waited, timeout=120)
        finally:
            if not stack.supervisor.get("placement").alive:
                await stack.supervisor.restart("placement")
            await _let_go(api, ns, every=True)
        assert placed["spec"]["nodeName"] == NODE
        await _settled(api, ns, uids, expected)
        await consistent(cluster, stack)


async def _again(api: KubeApi, pods: str, ns: str) -> str:
    """A second pod of the same size and priority: the room is free, and it takes it."""
    await api.create(pods, prioritized("again", ns, WANT, HIGH))
    return "again"


async def _let_go(api: KubeApi, ns: str, every: bool = False) -> None:
    """The test's finalizer off the pods being deleted (the evicted ones), or off ``every`` pod."""
    for found in await pods_in(api, ns):
        meta = found["metadata"]
        if KEPT in (meta.get("finalizers") or []) and (every or meta.get("deletionTimestamp")):
            kept = [f for f in meta["finalizers"] if f != KEPT]
            with contextlib.suppress(ApiError):  # gone meanwhile
                await api.patch(f"/api/v1/namespaces/{ns}/pods/{meta['name']}", {"metadata": {"finalizers": kept}})


async def _settled(api: KubeApi, ns: str, uids: dict[str, str], expected: list[set[str]]) -> None:
    """One smallest set evicted, each of its pods told once, nobody else evicted, and that stays so."""
    await asyncio.sleep(5)  # a second preemption, were there one, would have evicted by now
    evicted = {name for name in uids.values() if name not in await _left(api, ns)}
    assert evicted in expected, f"evicted {sorted(evicted)}; the smallest sets were {expected}"
    told = await _preempted(api, ns)
    assert told == sorted(evicted), f"Preempted Events {told} for the evicted {sorted(evicted)}"
