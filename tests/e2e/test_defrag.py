"""Defragmentation on the real control plane (docs/preemption.md, "Defragmentation"): with placement
started with ``--defrag on``, a 5 GiB share pinned to p4-1, whose two cards each hold a 4 GiB
share of a movable ReplicaSet (and so 3.4 GiB free each), fits nowhere and has no one of lower
priority to preempt. Placement moves exactly one of the ReplicaSet's pods (Eviction API); the
ReplicaSet controller recreates it and it lands on p4-2, where it fits; the 5 GiB share binds on the
card it left. A bare pod, labelled movable or not, is never moved. (MIG: test_mig_defrag.py.)"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

import aiohttp
import pytest

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import POLL_S, consistent, ledger, movable_replica_set, namespace, pod, pods_in, running, share
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

TARGET, SPARE = "p4-1", "p4-2"  # two Tesla P4 of 7611 MiB each
MOVABLE_MIB, WANT_MIB, BLOCK_MIB = 4096, 5120, 7168


@contextlib.asynccontextmanager
async def defragmenting(stack: Stack) -> AsyncIterator[None]:
    """The stack's placement restarted with defragmentation on (same ports), and as it was after."""
    service = stack.supervisor.get("placement")
    plain = list(service.args)
    await service.stop()
    service.args = [*plain, "--defrag", "on"]
    await service.start()
    try:
        await _ready(stack)
        yield
    finally:
        await service.stop()
        service.args = plain
        await service.start()
        await _ready(stack)


async def _ready(stack: Stack) -> None:
    async def up() -> bool:
        async with aiohttp.ClientSession() as http, http.get(f"{stack.placement_ops}/readyz") as reply:
            return reply.status == 200

    await wait_for(up, 60, "placement ready again", 0.2)


def replica_set(ns: str, limits: dict[str, str], nodes: tuple[str, str]) -> dict[str, Any]:
    """Two pods asking ``limits`` that may run on either of ``nodes``, labelled movable."""
    spec = pod("x", ns, limits)["spec"]
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}]}
    spec["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    return movable_replica_set(ns, spec)


def idle(stack: Stack, node: str, mig_only: bool = False) -> Callable[[], Awaitable[bool]]:
    """Whether nobody holds the node's cards (with ``mig_only``: its MIG instances)."""

    async def check() -> bool:
        found = (await ledger(stack)).get(node)
        return found is not None and not any(not mig_only or s.mig for a in found.live() for s in a.shares())

    return check


def placed(api: KubeApi, ns: str, gone: Collection[str] = ()) -> Callable[[], Awaitable[list[dict[str, Any]] | None]]:
    """The ReplicaSet's two pods, once both are Running and neither is one of ``gone``."""

    async def check() -> list[dict[str, Any]] | None:
        found = [p for p in await pods_in(api, ns) if p["metadata"]["name"].startswith("movable-")]
        ok = len(found) == 2 and all(p["status"].get("phase") == "Running" for p in found)
        return found if ok and not {p["metadata"]["name"] for p in found} & set(gone) else None

    return check


async def told(api: KubeApi, ns: str) -> tuple[list[dict[str, Any]], set[str]]:
    """The namespace's events, and the pods moved (``GpuledgerMoved``); none of them preempted."""
    events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
    assert not any(e.get("reason") == "Preempted" for e in events)
    return events, {e["involvedObject"]["name"] for e in events if e.get("reason") == "GpuledgerMoved"}


@pytest.mark.timeout(300)
async def test_a_pod_that_fits_nowhere_gets_room_by_moving_one_movable_pod_to_another_node(
    stack: Stack, cluster: RealCluster, api: KubeApi
) -> None:
    for node in (TARGET, SPARE):
        await wait_for(idle(stack, node), 60, f"{node}'s cards held by nobody (an earlier test's pods gone)", POLL_S)
    async with defragmenting(stack), namespace(api, "e2e-defrag", stack) as ns:
        pods = f"/api/v1/namespaces/{ns}/pods"
        for i in range(2):  # p4-2 full while the ReplicaSet's pods are placed: they land on p4-1
            await api.create(pods, pod(f"block-{i}", ns, share(BLOCK_MIB), node=SPARE))
            await running(api, ns, f"block-{i}")
        movable = replica_set(ns, share(MOVABLE_MIB), (TARGET, SPARE))
        await api.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", movable)
        first = await wait_for(placed(api, ns), 90, "the ReplicaSet's two pods Running", POLL_S)
        assert {p["spec"]["nodeName"] for p in first} == {TARGET}
        bare = pod("bare", ns, share(1024), node=TARGET)  # a pod nothing recreates, labelled movable
        bare["metadata"]["labels"] = {"gpuledger.io/movable": "true"}
        await api.create(pods, bare)
        await running(api, ns, "bare")
        for i in range(2):
            await api.delete(f"{pods}/block-{i}", grace_s=0)
        await wait_for(idle(stack, SPARE), 60, f"{SPARE} free again", POLL_S)

        await api.create(pods, pod("big", ns, share(WANT_MIB), node=TARGET))
        big = await running(api, ns, "big", timeout=120)
        assert big["spec"]["nodeName"] == TARGET

        events, moved = await told(api, ns)
        assert len(moved) == 1 and moved <= {p["metadata"]["name"] for p in first}, moved
        said = next(e["message"] for e in events if e.get("reason") == "GpuledgerDefragmenting")
        assert TARGET in said and SPARE in said and next(iter(moved)) in said, said

        after = await wait_for(placed(api, ns, moved), 90, "the moved pod recreated and Running", POLL_S)
        assert sorted(p["spec"]["nodeName"] for p in after) == sorted([TARGET, SPARE])
        assert (await api.get(f"{pods}/bare"))["spec"]["nodeName"] == TARGET  # never moved
        found = (await ledger(stack))[TARGET]
        mine = [a for a in found.live() if a.owner.id == big["metadata"]["uid"]]
        assert len(mine) == 1 and mine[0].shares()[0].mem_mib == WANT_MIB
        await consistent(cluster, stack)
        await api.delete(f"/apis/apps/v1/namespaces/{ns}/replicasets/movable")
