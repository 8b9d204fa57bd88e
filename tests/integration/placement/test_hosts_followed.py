"""Placement with its default settings (no guard) follows each Node's allocatable CPU and memory and
the pods bound to it, through the fake API server: a pod with cards is judged against the CPU and
memory its node has left, as kube-scheduler judges it. (The node's state in the view that carries
them is also what the balance term of ``default`` and the guard read.)"""

from __future__ import annotations

import aiohttp
import pytest

from gpuledger_testing.fake_apiserver import FakeApiServer
from gpuledger_testing.stack import RunningPlacement, wait_for

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
