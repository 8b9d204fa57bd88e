"""Placement with its default settings (no guard) follows each Node's allocatable CPU and memory and
the pods bound to it, through the fake API server: a pod with cards is judged against the CPU and
memory its node has left, as kube-scheduler judges it, and ``default`` scores a CPU-heavy pod
higher where CPU is plentiful than on a twin node whose cards its CPU would strand."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client

from gpuledger_common.announce import announce
from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import NatsServer
from tests.support.replicas import RunningAllocator, RunningPlacement, running_placement, wait_for

from .helpers import args, gpu_pod, post

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_nodes_cpu_and_memory_are_followed_without_the_guard(
    apiserver: FakeApiServer, placement: RunningPlacement, http: aiohttp.ClientSession
) -> None:
    assert placement.settings.guard == "off"
    apiserver.add_node("rtx-0", {"cpu": "1500m", "memory": "64Gi"})
    apiserver.add_node("h100-0", {"cpu": "96", "memory": "1Gi"})
    apiserver.add_node("p4-0", {"cpu": "32", "memory": "128Gi"})
    other = gpu_pod("other", gpu=1, mem=1000)
    other["spec"]["nodeName"], other["status"] = "rtx-0", {"phase": "Running"}
    apiserver.add_pod(other)  # bound there already: its CPU (1) is taken from rtx-0's 1.5
    pod = gpu_pod("train", gpu=1, mem=1000)  # requests 1 CPU and 2 GiB

    async def judged() -> dict[str, str] | None:
        status, body = await post(http, f"{placement.url}/filter", args(pod, ["rtx-0", "h100-0", "p4-0"]))
        assert status == 200, body
        failed: dict[str, str] = body["FailedNodes"]
        return failed if len(failed) == 2 else None

    failed = await wait_for(judged, what="the Nodes followed")
    assert failed["rtx-0"] == "500m CPU free, 500m short of 1000m"
    assert failed["h100-0"] == "1024 MiB memory free, 1024 MiB short of 2048 MiB"

    apiserver.delete_pod("default", "other")  # its CPU is free again: rtx-0 fits

    async def fits() -> bool:
        _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("next", gpu=1, mem=1000), ["rtx-0"]))
        return bool(body["NodeNames"] == ["rtx-0"])

    await wait_for(fits, what="the bound pod's end followed")


async def test_default_scores_a_cpu_heavy_pod_where_cpu_is_plentiful_without_the_guard(
    nats_server: NatsServer,
    nc: Client,
    allocator: RunningAllocator,
    apiserver: FakeApiServer,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    twin = parse_fleet("nodes:\n  - name: h100-1\n    profile: h100-sxm-8\n").nodes[0].node
    await announce(nc, [twin])  # h100-0's twin in the ledger: the two differ only in CPU
    apiserver.add_node("h100-0", {"cpu": "96", "memory": "1024Gi"})
    apiserver.add_node("h100-1", {"cpu": "20", "memory": "1024Gi"})
    config = str(apiserver.kubeconfig(tmp_path / "kubeconfig"))
    async with running_placement(nats_server.url, kube="kubeconfig", kubeconfig=config, workload_refresh_s=0.2) as p:
        assert p.settings.guard == "off" and p.settings.policy == "default"
        typical = gpu_pod("typical", gpu=1, mem=1000)
        typical["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
        heavy = gpu_pod("heavy", gpu=1, mem=1000)
        heavy["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"

        async def scores() -> dict[str, int] | None:
            # The workload learns its pods' CPU per card from what filter sees (p4-0: away from the twins).
            assert (await post(http, f"{p.url}/filter", args(typical, ["p4-0"])))[0] == 200
            status, body = await post(http, f"{p.url}/prioritize", args(heavy, ["h100-0", "h100-1"]))
            assert status == 200, body
            found = {entry["Host"]: entry["Score"] for entry in body}
            return found if found["h100-0"] > found["h100-1"] else None

        await wait_for(scores, 20, "h100-0 (96 cores) scored above h100-1 (20 cores)", 0.1)
