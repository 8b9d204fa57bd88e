"""The guard's view of each node's CPU and memory (hosts.py), and the guard at filter for a pod
that takes no card: tables, and the list-then-watch loop over a scripted API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from gpuledger_core.fit import ContainerAsk
from gpuledger_core.model import Owner, OwnerKind, Request
from gpuledger_core.pods import PodAsk
from gpuledger_placement.hosts import BOUND, NODES, PODS, HostUsage, follow

from .fleet import parts


def node(name: str, cpu: str, memory: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": memory}}}


def pod(uid: str, node_name: str, cpu: str, memory: str = "1Gi", phase: str = "Running") -> dict[str, Any]:
    resources = {"requests": {"cpu": cpu, "memory": memory}}
    return {
        "metadata": {"uid": uid},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": phase},
    }


def test_free_is_allocatable_less_the_requests_of_the_pods_that_have_not_ended() -> None:
    usage = HostUsage()
    assert usage.free("rtx-0") is None  # not listed yet
    usage.replace([node("rtx-0", "16", "64Gi")], [pod("a", "rtx-0", "2"), pod("b", "rtx-0", "500m", "512Mi")])
    assert usage.free("rtx-0") == (13500, 65536 - 1024 - 512)
    usage.set_pod(pod("a", "rtx-0", "2", phase="Succeeded"))  # ended: its requests are free again
    assert usage.free("rtx-0") == (15500, 65536 - 512)
    usage.set_pod(pod("b", "rtx-0", "4"))  # the same pod again: counted once, as it is now
    assert usage.free("rtx-0") == (12000, 65536 - 1024)
    usage.drop_pod("b")
    usage.bound("c", "rtx-0", 1000, 2048)  # bound by this service, before the watch brings it
    assert usage.free("rtx-0") == (15000, 65536 - 2048)
    usage.drop_node(node("rtx-0", "16", "64Gi"))
    assert usage.free("rtx-0") is None


def test_a_node_whose_allocatable_makes_no_sense_is_left_out() -> None:
    usage = HostUsage()
    usage.replace([node("odd", "lots", "64Gi")], [])
    assert usage.free("odd") is None


def cpu_only(cpu_milli: int, memory_mib: int = 1024) -> PodAsk:
    return PodAsk(Owner(OwnerKind.POD, "uid-cpu", "ns", "cpu"), (), cpu_milli=cpu_milli, memory_mib=memory_mib)


def test_the_guard_keeps_cpu_and_memory_for_a_gpu_nodes_free_cards() -> None:
    usage = HostUsage()
    usage.replace([node("rtx-0", "16", "64Gi"), node("h100-0", "96", "1024Gi"), node("cpu-0", "8", "8Gi")], [])
    built = parts(guard="4:32", hosts=usage)
    found = built.service.filter(cpu_only(14000), ["rtx-0", "h100-0", "cpu-0", "p4-0"])
    assert found.fits == ("h100-0", "cpu-0")  # cpu-0 has no card to strand; 96 - 14 >= 8 x 4 on h100-0
    assert found.failed["rtx-0"] == "guard: CPU left would be 2000m, below the 4000m kept for 1 free card(s)"
    assert found.failed["p4-0"] == "guard: gpuledger does not know this GPU node's CPU and memory yet"
    memory = built.service.filter(cpu_only(1000, 40 * 1024), ["rtx-0"])
    assert (
        memory.failed["rtx-0"] == "guard: memory left would be 24576 MiB, below the 32768 MiB kept for 1 free card(s)"
    )
    assert built.service.filter(cpu_only(10000), ["rtx-0"]).fits == ("rtx-0",)


def test_a_pod_asking_through_resource_claims_is_not_guarded() -> None:
    """Its claims may be for cards (DRA allocates them, the ledger checks them): the guard that keeps
    a GPU node's CPU for its free cards must not keep it from the pod that takes them."""
    usage = HostUsage()
    usage.replace([node("rtx-0", "16", "64Gi")], [])
    built = parts(guard="4:32", hosts=usage)
    claiming = PodAsk(Owner(OwnerKind.POD, "uid-dra", "ns", "dra"), (), cpu_milli=14000, memory_mib=1024, claims=True)
    assert built.service.filter(claiming, ["rtx-0"]).fits == ("rtx-0",)
    assert built.service.filter(cpu_only(14000), ["rtx-0"]).failed["rtx-0"].startswith("guard: CPU left")


def test_a_pod_with_resource_claims_says_so() -> None:
    from gpuledger_placement.convert import pod_ask_from

    body = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}}
    assert not pod_ask_from(body).claims
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "claim"}]  # type: ignore[index]
    assert pod_ask_from(body).claims


def test_without_the_guard_every_node_passes_a_pod_that_takes_no_card() -> None:
    usage = HostUsage()
    usage.replace([node("rtx-0", "16", "64Gi")], [])
    assert parts(hosts=usage).service.filter(cpu_only(15000), ["rtx-0", "p4-0"]).fits == ("rtx-0", "p4-0")


class ScriptedApi:
    """Lists as given; each watch yields its events, then the next watch fails (a 410)."""

    def __init__(self, lists: dict[str, list[dict[str, Any]]], events: dict[str, list[dict[str, Any]]]) -> None:
        self.lists, self.events, self.calls = lists, events, []  # type: ignore[var-annotated]
        self.watched: dict[str, int] = {}

    async def list_objects(self, path: str, params: Mapping[str, str], timeout_s: float = 60.0) -> dict[str, Any]:
        self.calls.append(("list", path, dict(params)))
        return {"metadata": {"resourceVersion": "7"}, "items": self.lists[path]}

    async def watch(
        self, path: str, params: Mapping[str, str], timeout_s: float = 300.0
    ) -> AsyncIterator[dict[str, Any]]:
        from gpuledger_core.errors import FailedPrecondition

        self.calls.append(("watch", path, dict(params)))
        turn = self.watched[path] = self.watched.get(path, 0) + 1
        if turn > 1:
            await asyncio.sleep(0.05)
            raise FailedPrecondition(f"watch {path}: too old resource version")
        for event in self.events[path]:
            yield event


async def test_follow_lists_then_watches_and_lists_again_when_a_watch_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpuledger_placement.hosts.RETRY_S", 0.01)
    api = ScriptedApi(
        {NODES: [node("rtx-0", "16", "64Gi")], PODS: [pod("a", "rtx-0", "2")]},
        {
            NODES: [{"type": "ADDED", "object": node("p4-0", "16", "64Gi")}],
            PODS: [
                {"type": "ADDED", "object": pod("b", "p4-0", "3")},
                {"type": "DELETED", "object": pod("a", "rtx-0", "2")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
            ],
        },
    )
    usage = HostUsage()
    task = asyncio.create_task(follow(api, usage))
    try:
        for _ in range(100):
            if usage.free("p4-0") == (13000, 65536 - 1024) and usage.free("rtx-0") == (16000, 65536):
                break
            await asyncio.sleep(0.02)
        assert usage.free("p4-0") == (13000, 65536 - 1024)
        assert usage.free("rtx-0") == (16000, 65536)
        assert ("list", PODS, {"fieldSelector": BOUND}) in api.calls
        assert ("watch", PODS, {"fieldSelector": BOUND, "resourceVersion": "7"}) in api.calls
        for _ in range(100):  # the second watch fails: everything is listed again
            if sum(1 for c in api.calls if c[:2] == ("list", NODES)) >= 2:
                break
            await asyncio.sleep(0.02)
        assert sum(1 for c in api.calls if c[:2] == ("list", NODES)) >= 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def gpu_pod(cpu_milli: int) -> PodAsk:
    owner = Owner(OwnerKind.POD, "uid-gpu", "ns", "gpu")
    return PodAsk(owner, (ContainerAsk("c", Request(1)),), cpu_milli=cpu_milli, memory_mib=1024)


def test_a_nodes_cpu_is_part_of_its_state_and_a_change_is_seen_at_once() -> None:
    usage = HostUsage()
    built = parts(guard="4:32", hosts=usage)
    usage.replace([node("rtx-0", "16", "64Gi"), node("p4-0", "16", "64Gi")], [pod("busy", "rtx-0", "12")])
    first = built.service.filter(gpu_pod(8000), ["rtx-0", "p4-0"])
    assert first.fits == ("p4-0",)
    assert first.failed["rtx-0"] == "4000m CPU free, 4000m short of 8000m"
    usage.drop_pod("busy")  # its pod ended: rtx-0's state (and every answer from it) is made again
    again = built.service.filter(gpu_pod(8000), ["rtx-0"])
    assert again.fits == ("rtx-0",)
    assert built.view.entries["rtx-0"].state.cpu_free == 16000
