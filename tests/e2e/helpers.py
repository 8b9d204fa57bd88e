"""What the e2e tests share: pods as users write them, waiting on the real API server, the ledger
read straight from JetStream, and the ledger-versus-pods check."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from gpuledger_core.ledger import NodeLedger
from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from gpuledger_placement.repacker import MOVABLE_LABEL
from tests.support.ledger_check import Report, check, read_ledger
from tests.support.waiting import wait_for

SLOTS_PER_CARD = 8
POLL_S = 0.1  # how often a wait asks the API server or the ledger again
LOW, HIGH = "e2e-low", "e2e-high"  # priority classes (``priority_classes``)


def pod(
    name: str, namespace: str, limits: dict[str, str], annotations: dict[str, str] | None = None, node: str = ""
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "gpuledger-scheduler",
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": "cuda", "resources": {"limits": dict(limits)}}],
    }
    if node:
        term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": spec,
    }


def card_nodes(dev: Iterable[str]) -> list[str]:
    """The cards' device nodes (``nvidia<minor>``) among a real node's container's /dev entries."""
    return sorted(d for d in dev if d.startswith("nvidia") and d[len("nvidia") :].isdigit())


def movable_replica_set(ns: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A ReplicaSet "movable" of two pods of ``spec``, labelled for defragmentation to move."""
    labels = {"app": "movable", MOVABLE_LABEL: "true"}
    return {
        "metadata": {"name": "movable", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "movable"}},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def share(mib: int, cards: int = 1) -> dict[str, str]:
    return {"gpuledger.io/gpu": str(cards), "gpuledger.io/gpu-mem": str(mib)}


@contextlib.asynccontextmanager
async def namespace(api: KubeApi, name: str, stack: Stack | None = None) -> AsyncIterator[str]:
    """A namespace for one test, deleted (with its pods) afterwards; with ``stack``, the exit
    also waits until the ledger holds nothing for the namespace (the next test finds the room)."""
    with contextlib.suppress(ApiError):
        await api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiError):
            await api.call("DELETE", f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": "0"})
        with contextlib.suppress(ApiError):
            await api.delete(f"/api/v1/namespaces/{name}")
        if stack is not None:
            await _namespace_released(stack, name)


async def _namespace_released(stack: Stack, name: str, timeout: float = 60) -> None:
    async def check() -> bool:
        return not any(a.owner.namespace == name for found in (await ledger(stack)).values() for a in found.live())

    await wait_for(check, timeout, f"every card held in namespace {name} released", interval=0.5)


async def get_pod(api: KubeApi, namespace: str, name: str) -> dict[str, Any]:
    return dict(await api.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))


async def pods_in(api: KubeApi, namespace: str) -> list[dict[str, Any]]:
    return list((await api.get(f"/api/v1/namespaces/{namespace}/pods"))["items"])


async def running(api: KubeApi, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        found = await get_pod(api, namespace, name)
        return found if found.get("status", {}).get("phase") == "Running" else None

    return dict(await wait_for(check, timeout, f"pod {namespace}/{name} Running", POLL_S))


async def gone(api: KubeApi, namespace: str, name: str, timeout: float = 30) -> None:
    """Wait until the pod is no longer in the API (a StatefulSet makes its successor only then)."""

    async def check() -> bool:
        try:
            await get_pod(api, namespace, name)
        except ApiError as err:
            if err.status == 404:
                return True
            raise
        return False

    await wait_for(check, timeout, f"pod {namespace}/{name} gone", POLL_S)


async def ledger(stack: Stack) -> dict[str, NodeLedger]:
    """The ledger straight from JetStream, as the stack's operator user (TLS, its own password)."""
    return await read_ledger(stack.nats_url, stack.operator)


async def live_allocations_of(stack: Stack, uid: str) -> list[Any]:
    return [a for found in (await ledger(stack)).values() for a in found.live() if a.owner.id == uid]


async def released(stack: Stack, uid: str, timeout: float = 30) -> None:
    async def check() -> bool:
        return not await live_allocations_of(stack, uid)

    await wait_for(check, timeout, f"the cards of pod uid {uid} released", POLL_S)


async def all_pods(api: KubeApi) -> list[dict[str, Any]]:
    return list((await api.get("/api/v1/pods"))["items"])


async def consistent(cluster: RealCluster, stack: Stack, timeout: float = 60) -> Report:
    """Wait until the ledger equals what the pods hold (see tests.support.ledger_check)."""
    assert cluster.api is not None
    api = cluster.api
    last: list[Report] = []

    async def check_now() -> Report | None:
        report = check((await ledger(stack)).values(), await all_pods(api), SLOTS_PER_CARD, time.time())
        last[:] = [report]
        return report if report.ok else None

    try:
        found: Report = await wait_for(check_now, timeout, "ledger equal to the pods", interval=1.0)
    except TimeoutError as err:
        raise AssertionError(f"{err}: {last[0] if last else 'never checked'}") from None
    return found


STEADY_S = 15.0  # longer than kube-scheduler's longest backoff (podMaxBackoffSeconds, 10 s)


def steady(running_if_settled: Callable[[], Awaitable[int | None]]) -> Callable[[], Awaitable[bool]]:
    """A check for ``wait_for``: settled (``running_if_settled`` gives how many pods run, or None
    while not settled) and with as many pods running ``STEADY_S`` later. A pod refused while a
    service was down is tried again within kube-scheduler's backoff, so one settled look right
    after a fault is not the end."""
    seen: list[tuple[float, int]] = []

    async def check() -> bool:
        running = await running_if_settled()
        if running is None:
            seen.clear()
            return False
        now = asyncio.get_running_loop().time()
        if not seen or seen[0][1] != running:
            seen[:] = [(now, running)]
            return False
        return now - seen[0][0] >= STEADY_S

    return check


@contextlib.asynccontextmanager
async def priority_classes(api: KubeApi) -> AsyncIterator[None]:
    for name, value in ((LOW, 10), (HIGH, 1000)):
        with contextlib.suppress(ApiError):
            body = {"metadata": {"name": name}, "value": value, "preemptionPolicy": "PreemptLowerPriority"}
            await api.create("/apis/scheduling.k8s.io/v1/priorityclasses", body)
    try:
        yield
    finally:
        for name in (LOW, HIGH):
            with contextlib.suppress(ApiError):
                await api.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def smallest_sets(found: NodeLedger, uids: dict[str, str], want: int) -> list[set[str]]:
    """Every smallest set of the holders named in ``uids`` (owner uid -> name) on one card whose
    going leaves ``want`` MiB free there."""
    by_card: dict[int, list[tuple[str, int]]] = {}
    for allocation in found.live():
        name = uids.get(allocation.owner.id)
        if name is not None:
            for s in allocation.shares():
                by_card.setdefault(s.index, []).append((name, s.mem_mib))
    used = {c.index: sum(s.mem_mib for a in found.live() for s in a.shares() if s.index == c.index)
            for c in found.node.cards}  # fmt: skip
    memory = {c.index: c.memory_mib for c in found.node.cards}
    for size in range(1, len(uids) + 1):
        sets = [
            {name for name, _ in combo}
            for card, held in by_card.items()
            for combo in itertools.combinations(held, size)
            if memory[card] - used[card] + sum(mib for _, mib in combo) >= want
        ]
        if sets:
            return sets
    return []
