"""Filter then bind the way kube-scheduler drives them: each pod is filtered (and, if several nodes
are left, prioritized) in turn, and its bind runs later, so pod 2 is filtered before pod 1's bind
has written anything. A real nats-server and ledger, the fake API server, the real client."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import aiohttp
import pytest
from prometheus_client import REGISTRY

from gpuledger_common.store import LedgerStore
from gpuledger_core.slots import card_of
from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.fleet import Fleet, parse_fleet
from tests.support.replicas import RunningPlacement

from .helpers import args, bind_args, gpu_pod, post

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
NODES = [f"gpu-{n:02d}" for n in range(13)]
PODS = 100


@pytest.fixture
def fleet() -> Fleet:
    """13 nodes of 8 whole cards (104 cards): the allocator fixture announces them."""
    return parse_fleet("nodes:\n" + "".join(f"  - name: {n}\n    profile: h100-sxm-8\n" for n in NODES))


def assumptions(event: str) -> float:
    return REGISTRY.get_sample_value("gpuledger_placement_assumptions_total", {"event": event}) or 0.0


async def scheduling_cycle(http: aiohttp.ClientSession, url: str, pod: dict[str, Any]) -> str | None:
    """kube-scheduler's cycle for one pod: filter; prioritize when more than one node is left
    (the best score, the first on ties); the node it would bind, or None if none fits."""
    _, filtered = await post(http, f"{url}/filter", args(pod, NODES))
    feasible: list[str] = filtered["NodeNames"] or []
    if len(feasible) <= 1:
        return feasible[0] if feasible else None
    _, scores = await post(http, f"{url}/prioritize", args(pod, feasible))
    best = max(entry["Score"] for entry in scores)
    return str(next(entry["Host"] for entry in scores if entry["Score"] == best))


async def test_pods_filtered_before_the_binds_land_are_all_bound(
    placement: RunningPlacement, apiserver: FakeApiServer, nc: Any, http: aiohttp.ClientSession
) -> None:
    pods = [apiserver.add_pod(gpu_pod(f"job-{n:03d}", gpu=1)) for n in range(PODS)]
    made, bound = assumptions("made"), assumptions("bound")
    cycles_done = asyncio.Event()

    async def bind_later(name: str, node: str) -> str:
        await cycles_done.wait()  # every pod is filtered before any bind is written
        _, body = await post(http, f"{placement.url}/bind", bind_args(name, node))
        return str(body["Error"])

    started = time.perf_counter()
    binds: list[asyncio.Task[str]] = []
    for pod in pods:
        node = await scheduling_cycle(http, placement.url, pod)
        assert node is not None, f"{pod['metadata']['name']} fit nowhere: 100 pods, 104 free cards"
        binds.append(asyncio.create_task(bind_later(pod["metadata"]["name"], node)))
    cycles_done.set()
    errors = await asyncio.gather(*binds)
    elapsed = time.perf_counter() - started

    refused = [e for e in errors if e]
    assert refused == [], f"{len(refused)} of {PODS} binds refused, e.g. {refused[0]}"
    assert len(apiserver.bindings) == PODS
    assert assumptions("made") - made == PODS and assumptions("bound") - bound == PODS
    store = await LedgerStore.open(nc)
    holders: Counter[str] = Counter()
    for node in NODES:
        ledger, _ = await store.read(node)
        assert ledger is not None
        for allocation in ledger.live():
            holders.update(card_of(i) for g in allocation.grants for i in g.device_ids)
    assert sum(holders.values()) == PODS and max(holders.values()) == 1  # whole cards: one holder each
    print(f"{PODS} pods filtered then bound in {elapsed:.2f}s ({PODS / elapsed:.0f} pods/s)")


async def test_the_101st_to_105th_pods_find_the_room_taken_by_the_binds_in_flight(
    placement: RunningPlacement, apiserver: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    chosen = []
    for n in range(104):
        node = await scheduling_cycle(http, placement.url, gpu_pod(f"fill-{n:03d}", gpu=1))
        assert node is not None
        chosen.append(node)
    assert Counter(chosen) == dict.fromkeys(NODES, 8)  # each node is given exactly its 8 cards
    _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("one-too-many", gpu=1), NODES))
    assert body["NodeNames"] == []
    assert "(counting 8 pod(s) placed here, being bound)" in body["FailedNodes"][NODES[0]]
