"""The share audit on the real control plane (docs/audit.md): a pod's share of a card, and processes
on that card that NVML reports with the memory they use. The node's inventory runs in this process
on the fake NVML with ``--proc-root`` a directory the test writes as a node's /proc would show the
processes (``<pid>/cgroup`` under the pod's kubepods cgroup, systemd driver, cgroup v2): the
inventory reads it exactly as it reads the host's. The fake NVML samples the processes' SM time.

Within its grant the pod's use (memory and SM time) shows in the allocator's listing and nothing
happens; over it the
listing marks it, the allocator's metric names it, placement puts a GpuledgerOverGrant Event on the
pod and, with ``--over-grant-action evict``, evicts it after the grace; a process of no pod stays
foreign and is nobody's over-grant."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.local_stack import Stack
from tests.e2e.helpers import POLL_S, ledger, namespace, pod, pods_in, running, share
from tests.support.card_repair import RepairingNode, in_stack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

NODE = "p4-2"  # two Tesla P4 of 7611 MiB
GRANT = 2048
GRACE_S = 4


def cgroup_line(pod_uid: str, container_id: str) -> str:
    """What /proc/<pid>/cgroup says of a container's process under kubelet's systemd driver (v2)."""
    slice_uid = pod_uid.replace("-", "_")
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-{container_id}.scope\n"
    )


def write_process(root: Path, pid: int, line: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(line)


@contextlib.asynccontextmanager
async def placement_evicting(stack: Stack) -> AsyncIterator[None]:
    """Placement started again with ``--over-grant-action evict`` and a short grace, for the block."""
    service = stack.supervisor.get("placement")
    original = list(service.args)
    service.args = [*original, "--over-grant-action", "evict", "--over-grant-grace-s", str(GRACE_S)]
    await stack.supervisor.restart("placement")
    try:
        yield
    finally:
        service.args = original
        await stack.supervisor.restart("placement")


async def holder_in_listing(stack: Stack, uid: str) -> dict[str, Any] | None:
    """The pod's holder entry in the allocator's listing (its dashboard JSON), with its card's."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{stack.dashboard.rstrip('/')}/api/cluster?node={NODE}") as reply,
    ):
        body = await reply.json()
    for node in body["nodes"]:
        for card in node["cards"]:
            for holder in card.get("holders") or []:
                if holder.get("owner", {}).get("id") == uid:
                    return {**holder, "card": card}
    return None


async def allocator_metrics(stack: Stack) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{stack.dashboard.rstrip('/')}/metrics") as reply:
        return await reply.text()


async def events_of(api: KubeApi, ns: str, reason: str) -> list[dict[str, Any]]:
    events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
    return [e for e in events if e.get("reason") == reason]


@pytest.mark.timeout(300)
async def test_a_share_over_its_grant_is_shown_told_and_evicted_after_the_grace(
    stack: Stack, api: KubeApi, tmp_path: Path
) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    async with (
        namespace(api, "e2e-audit", stack) as ns,
        in_stack(stack, NODE, "--proc-root", str(proc), "--poll-interval-s", "1") as node,
        placement_evicting(stack),
    ):
        made = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("greedy", ns, share(GRANT), node=NODE))
        await running(api, ns, "greedy")
        uid = made["metadata"]["uid"]
        held = [a for a in (await ledger(stack))[NODE].live() if a.owner.id == uid]
        assert len(held) == 1, held
        card = held[0].shares()[0].index
        container = "ab" * 32
        write_process(proc, 4100, cgroup_line(uid, container))
        write_process(proc, 4200, "0::/system.slice/some-daemon.service\n")  # nobody's pod

        node.nvml.set_utilization(card, {4100: 40, 4200: 5})
        within = await _using(stack, node, card, uid, 1500)
        assert not within["over"] and within["card"]["foreign_processes"] == 1, within
        assert within["used_core_milli"] == 400, within  # its process's share of the SM time, shown
        assert not await events_of(api, ns, "GpuledgerOverGrant")

        over = await _using(stack, node, card, uid, GRANT + 1000)
        assert over["over"], over
        assert await _metric_names(stack, ns), "gpuledger_holder_over_grant_mib has no series for the pod"
        told = await wait_for(lambda: events_of(api, ns, "GpuledgerOverGrant"), 60, "an Event on the pod", POLL_S)
        assert [e["involvedObject"]["name"] for e in told] == ["greedy"], told
        message = told[0]["message"]
        assert f"card {card}" in message and str(GRANT) in message and str(GRANT + 1000) in message, message

        async def evicted() -> bool:
            return not any(p["metadata"]["name"] == "greedy" for p in await pods_in(api, ns))

        await wait_for(evicted, 60, f"pod greedy evicted {GRACE_S}s after it went over", POLL_S)
        said = await events_of(api, ns, "GpuledgerOverGrantEvicted")
        assert [e["involvedObject"]["name"] for e in said] == ["greedy"], said
        assert len(await events_of(api, ns, "GpuledgerOverGrant")) == 1  # once per episode


async def _using(stack: Stack, node: RepairingNode, card: int, uid: str, mib: int) -> dict[str, Any]:
    """The pod's process uses ``mib`` on its card (and the other process 100 MiB); its holder entry
    once the listing shows that use."""
    node.nvml.set_processes(card, [(4100, mib, None), (4200, 100, None)])

    async def shown() -> dict[str, Any] | None:
        found = await holder_in_listing(stack, uid)
        return found if found is not None and found.get("used_mib") == mib else None

    return await wait_for(shown, 60, f"the pod's use of {mib} MiB on card {card} in the listing", POLL_S)


async def _metric_names(stack: Stack, ns: str) -> bool:
    text = await allocator_metrics(stack)
    return any(
        line.startswith("gpuledger_holder_over_grant_mib{")
        and f'holder_namespace="{ns}"' in line
        and 'holder_pod="greedy"' in line
        for line in text.splitlines()
    )
