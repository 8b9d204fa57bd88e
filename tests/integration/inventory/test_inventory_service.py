"""The inventory service against a real nats-server: what the allocator and operators see."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from gpuledger_common import bus, inventory_api
from gpuledger_core import codec
from gpuledger_core.errors import InvalidArgument, NotFound
from gpuledger_core.model import Health, Node
from gpuledger_dev.fake_nvml import FakeNvml, ManualClock
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import node_script
from gpuledger_dev.natsserver import NatsServer, embedded_nats
from gpuledger_inventory.app import Running, serve
from gpuledger_inventory.labels import PREFIX
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.settings import InventorySettings
from gpuledger_inventory.state import Host
from tests.support.fake_kube import FakeNodeApi

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

FLEET = """
nodes:
  - name: gpu-a
    profile: h100-sxm-8
    processes:
      - {card: 2, pid: 4242, memory_mib: 1000}
    faults:
      - {at: 10, card: 3, xid: 79}
      - {at: 20, kind: nvml_down, until: 30}
"""


class Feed:
    """Every message on one subject, in order; wait for one that matches."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.seen: list[Any] = []

    async def on_msg(self, msg: Msg) -> None:
        await self.queue.put(json.loads(msg.data))

    async def next(
        self, match: Callable[[Any], bool] = lambda _: True, timeout: float = 10.0
    ) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                item = await self.queue.get()
                self.seen.append(item)
                if match(item):
                    return item


@dataclass
class Stack:
    nc: Client
    fake: FakeNvml
    kube: FakeNodeApi
    inventory: Feed
    heartbeat: Feed
    health: Feed
    running: Running


POD_UID = "0c1e6b8e-54c1-4b7e-9d7a-3f2a1b0c9d8e"
CONTAINER_ID = "ab" * 32


def node_of(message: Any) -> Node:
    return codec.node_from(codec.Reader(message["node"]))


def settings(url: str, **kw: Any) -> InventorySettings:
    base: dict[str, Any] = {
        "node": "gpu-a",
        "nats_url": url,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "heartbeat_interval_s": 0.1,
        "inventory_interval_s": 5.0,
        "poll_interval_s": 0.1,
        "event_wait_ms": 50,
        "nvml_retry_max_s": 0.2,
        "kube": "off",
    }
    return InventorySettings(**(base | kw))


@pytest.fixture
async def nats_server() -> AsyncIterator[NatsServer]:
    async with embedded_nats() as server:
        yield server


@pytest.fixture
async def stack(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Stack]:
    sim = node_script(parse_fleet(FLEET, "fleet.yaml"), "gpu-a")
    fake = FakeNvml(sim, clock=ManualClock())
    gpus = NvmlGpus(fake, fake.numa_node, "fake")
    kube = FakeNodeApi({"gpu-a": {"kubernetes.io/hostname": "gpu-a", f"{PREFIX}stale": "x"}})
    nc = await bus.connect(nats_server.url, "test")
    feeds = Feed(), Feed(), Feed()
    for feed, subject in zip(
        feeds, ("inventory.gpu-a", "heartbeat.gpu-a", "inventory.gpu-a.health"), strict=True
    ):
        await nc.subscribe(f"gpuledger.v1.{subject}", cb=feed.on_msg)
    stop = asyncio.Event()
    started: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
    proc = tmp_path / "proc"  # the host's /proc as the inventory reads it: pid 4242 runs in a pod
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text(f"0::/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}\n")
    s = settings(nats_server.url, state_file=str(tmp_path / "health.json"), proc_root=str(proc))
    task = asyncio.create_task(
        serve(
            s,
            gpus=gpus,
            host=Host(224000, 2097152),
            node_api=kube,
            stop=stop,
            on_started=started.set_result,
        )
    )
    running = await asyncio.wait_for(started, 10)
    try:
        yield Stack(nc, fake, kube, *feeds, running)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await nc.close()


async def test_the_allocator_sees_the_node_and_its_heartbeat(stack: Stack) -> None:
    message = await stack.inventory.next(lambda m: len(m["node"]["cards"]) == 8)
    node = node_of(message)
    assert node.name == "gpu-a"
    assert {c.health for c in node.cards} == {Health.HEALTHY}
    assert {ln.nvlinks for ln in node.links} == {18}
    assert len(node.links) == 28
    assert (node.cpu_milli, node.memory_mib) == (224000, 2097152)
    assert dict(node.labels)[f"{PREFIX}product"] == "NVIDIA-H100-80GB-HBM3"
    assert message["extra"]["driver_version"] == "560.35.03"
    first = await stack.heartbeat.next()
    second = await stack.heartbeat.next()
    assert set(first) == {"node", "at", "seq"}
    assert second["seq"] == first["seq"] + 1


async def test_foreign_processes_are_reported(stack: Stack) -> None:
    message = await stack.inventory.next(
        lambda m: bool(m["extra"]["cards"]) and m["extra"]["cards"][2]["processes"]
    )
    assert message["extra"]["cards"][2]["processes"] == [
        {
            "pid": 4242,
            "used_mib": 1000,
            "mig_uuid": None,
            "sm_percent": 0,  # the fake samples no SM time for it
            "pod_uid": POD_UID,
            "container_id": CONTAINER_ID,
        }
    ]
    stack.fake.set_processes(2, [])
    await stack.inventory.next(lambda m: m["extra"]["cards"][2]["processes"] == [])


async def test_an_xid_turns_a_card_unhealthy_at_once_and_an_operator_brings_it_back(
    stack: Stack,
) -> None:
    await stack.inventory.next(lambda m: len(m["node"]["cards"]) == 8)
    stack.fake.inject_xid(3, 13)  # an application XID: ignored
    stack.fake.advance(10)  # the fleet's XID 79 on card 3
    transition = await stack.health.next()
    assert (transition["health"], transition["reason"], transition["by"]) == (
        "unhealthy",
        "XID 79: GPU has fallen off the bus",
        "xid",
    )
    message = await stack.inventory.next(lambda m: node_of(m).cards[3].health is Health.UNHEALTHY)
    card = node_of(message).cards[3]
    assert card.health_reason == "XID 79: GPU has fallen off the bus"
    assert [c.index for c in node_of(message).cards if not c.healthy] == [3]

    result = await inventory_api.set_card_health(stack.nc, "gpu-a", 3, True, "alice", "reseated")
    assert result["changed"] is True
    assert result["card"]["by"] == "operator:alice"
    back = await stack.health.next()
    assert (back["health"], back["by"], back["reason"]) == ("healthy", "operator:alice", "reseated")
    message = await stack.inventory.next(lambda m: node_of(m).cards[3].healthy)
    assert [t["by"] for t in message["extra"]["health_log"]] == ["xid", "operator:alice"]
    assert stack.health.queue.empty()  # the ignored XID 13 changed nothing


async def test_bad_operator_requests_are_refused(stack: Stack) -> None:
    await stack.inventory.next(lambda m: len(m["node"]["cards"]) == 8)
    with pytest.raises(NotFound):
        await inventory_api.set_card_health(stack.nc, "gpu-a", "GPU-nope", True, "alice")
    with pytest.raises(InvalidArgument) as caught:
        await inventory_api.set_card_health(stack.nc, "gpu-a", 1, True, "")
    assert caught.value.field == "by"


async def test_nvml_failure_marks_every_card_and_the_service_retries(stack: Stack) -> None:
    await stack.inventory.next(lambda m: len(m["node"]["cards"]) == 8)
    stack.fake.advance(20)  # NVML goes down (window 20..30); the XID 79 due at 10 is lost with it
    down = await stack.inventory.next(lambda m: not m["extra"]["nvml"]["ok"])
    assert {c.health for c in node_of(down).cards} == {Health.UNHEALTHY}
    assert "NVML failed" in node_of(down).cards[0].health_reason
    stack.fake.advance(10)  # NVML answers again: the rule heals the cards NVML alone had failed
    up = await stack.inventory.next(lambda m: m["extra"]["nvml"]["ok"])
    assert [c.index for c in node_of(up).cards if not c.healthy] == []
    assert any(t["by"] == "rule:nvml-returned" for t in up["extra"]["health_log"])


async def test_node_labels_touch_only_owned_keys(stack: Stack) -> None:
    async with asyncio.timeout(10):
        while f"{PREFIX}product" not in stack.kube.labels["gpu-a"]:
            stack.kube.changed.clear()
            await stack.kube.changed.wait()
    labels = stack.kube.labels["gpu-a"]
    assert labels["kubernetes.io/hostname"] == "gpu-a"
    assert f"{PREFIX}stale" not in labels
    assert (labels[f"{PREFIX}count"], labels[f"{PREFIX}nvswitch"]) == ("8", "true")


async def test_http_endpoints(stack: Stack) -> None:
    await stack.inventory.next(lambda m: len(m["node"]["cards"]) == 8)
    await asyncio.wait_for(stack.running.inventory.ready.wait(), 10)
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/readyz"):
            async with http.get(stack.running.http_url + path) as response:
                assert response.status == 200
        async with http.get(stack.running.http_url + "/metrics") as response:
            text = await response.text()
    assert "gpuledger_inventory_card_healthy" in text
    assert "gpuledger_inventory_nvml_up 1.0" in text


async def heartbeat_seen(url: str) -> None:
    nc = await bus.connect(url, "test")
    try:
        feed = Feed()
        await nc.subscribe("gpuledger.v1.heartbeat.gpu-a", cb=feed.on_msg)
        await feed.next(timeout=15)
    finally:
        await nc.close()


async def test_the_service_survives_the_loss_of_nats(nats_server: NatsServer) -> None:
    sim = node_script(parse_fleet(FLEET, "fleet.yaml"), "gpu-a")
    fake = FakeNvml(sim, clock=ManualClock())
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(settings(nats_server.url), gpus=NvmlGpus(fake, fake.numa_node, "fake"), stop=stop)
    )
    try:
        await heartbeat_seen(nats_server.url)  # the service is connected
        await nats_server.kill()
        await nats_server.start()
        await heartbeat_seen(nats_server.url)  # and has reconnected by itself
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_the_command_runs_on_a_fake_fleet_and_exits_on_sigterm(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    nc = await bus.connect(nats_server.url, "test")
    feed = Feed()
    await nc.subscribe("gpuledger.v1.inventory.gpu-a", cb=feed.on_msg)
    env = {**os.environ, "GPULEDGER_HTTP_PORT": "0", "GPULEDGER_KUBE": "off"}
    args = [
        "-m",
        "gpuledger_inventory",
        "--fake-fleet",
        str(fleet),
        "--node",
        "gpu-a",
        "--nats",
        nats_server.url,
    ]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        message = await feed.next(lambda m: len(m["node"]["cards"]) == 8, timeout=20)
        assert message["extra"]["backend"] == "fake"
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 15)
        assert proc.returncode == 0, stderr.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await nc.close()


async def test_a_bad_fleet_file_is_rejected_with_file_line_and_field(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n  - name: gpu-a\n    profile: rtx3090-1\n    faults:\n      - {card: 4, xid: 79}\n"
    )
    args = [
        "-m",
        "gpuledger_inventory",
        "--fake-fleet",
        str(fleet),
        "--node",
        "gpu-a",
        "--nats",
        "nats://127.0.0.1:1",
    ]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 2
    assert f"{fleet}:5: nodes[0].faults[0].card: card 4 does not exist" in stderr.decode()
