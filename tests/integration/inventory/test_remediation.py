"""Remediation on a real nats-server with the allocator: a failing card is drained, reset, checked
and back in service, the node's other cards untouched; a second fault within the window retires it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from gpuledger_cli.__main__ import parser
from gpuledger_common import bus, inventory_api
from gpuledger_core.errors import Unavailable
from gpuledger_dev.fake_nvml import FakeNvml, ManualClock
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import node_script
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.app import serve
from gpuledger_inventory.inventory import Scan
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.state import Host
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, running_allocator, wait_for

from .test_inventory_service import settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FLEET = """
nodes:
  - name: gpu-a
    profile: h100-sxm-8
    processes:
      - {card: 2, pid: 4242, memory_mib: 1000}
    resets:
      - {card: 2, result: ok, seconds: 0.2}
"""


@contextlib.asynccontextmanager
async def inventory(
    url: str, fake: FakeNvml, state_file: Path | None, gpus: NvmlGpus | None = None
) -> AsyncIterator[None]:
    stop = asyncio.Event()
    gpus = gpus or NvmlGpus(fake, fake.numa_node, "fake")
    config = settings(url, remediate=True, reset_timeout_s=5.0, state_file=str(state_file or ""))
    task = asyncio.create_task(serve(config, gpus=gpus, host=Host(224000, 2097152), stop=stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def publications(url: str) -> AsyncIterator[tuple[Client, list[Any]]]:
    """gpu-a's inventory publications as they come, and a connection to ask it on."""
    nc = await bus.connect(url, "test")
    published: list[Any] = []

    async def keep(msg: Msg) -> None:
        published.append(json.loads(msg.data))

    try:
        await nc.subscribe(inventory_api.inventory_subject("gpu-a"), cb=keep)
        yield nc, published
        await nc.flush()
    finally:
        await nc.close()


@pytest.fixture
async def allocator(nats_server: NatsServer) -> AsyncIterator[RunningAllocator]:
    async with running_allocator(nats_server.url, stale_after_s=1.5) as running:
        yield running


def fleet() -> FakeNvml:
    return FakeNvml(node_script(parse_fleet(FLEET, "fleet.yaml"), "gpu-a"), clock=ManualClock())


async def faulted(api: pb.AllocatorStub, fake: FakeNvml, index: int, xid: int, **want: str) -> pb.CardStatus:
    """With gpu-a's inventory running: card ``index`` healthy in the ledger, then XID ``xid``
    injected on it; the card once the ledger shows it as ``want`` says."""
    await wait_for(lambda: _with(api, index, health="healthy"), what="gpu-a in the ledger")
    fake.inject_xid(index, xid)
    said = ", ".join(f"{k} {v}" for k, v in want.items())
    return await wait_for(lambda: _with(api, index, **want), what=f"card {index} after XID {xid}: {said}")


async def cards(api: pb.AllocatorStub) -> dict[int, pb.CardStatus]:
    reply = await api.get_cluster(pb.GetClusterRequest(node="gpu-a"))
    return {c.index: c for c in reply.nodes[0].cards} if reply.nodes else {}


async def test_a_card_is_drained_reset_checked_and_back_then_retired_on_a_second_fault(
    nats_server: NatsServer, allocator: RunningAllocator, tmp_path: Path
) -> None:
    fake = fleet()
    api = allocator.stub()
    async with inventory(nats_server.url, fake, tmp_path / "health.json"):
        two = await faulted(api, fake, 2, 79, remedy="drain")
        assert two.health == "unhealthy"
        assert fake.calls.get("gpu_reset", 0) == 0  # a process still runs on it

        fake.set_processes(2, [])  # its holder is gone
        back = await wait_for(lambda: _with(api, 2, health="healthy", remedy=""), what="card 2 back")
        assert back.health_reason == "" and fake.calls["gpu_reset"] == 1
        others = await cards(api)
        assert all(c.health == "healthy" and c.remedy == "" for i, c in others.items() if i != 2)

        fake.inject_xid(2, 79)  # again, well within the window
        retired = await wait_for(lambda: _with(api, 2, remedy="retired"), what="card 2 retired")
        assert retired.health == "unhealthy" and fake.calls["gpu_reset"] == 1

    # a restart keeps it retired: the remediation is saved with the health book
    async with inventory(nats_server.url, fake, tmp_path / "health.json"):
        nc = await bus.connect(nats_server.url, "test")
        try:
            said = await wait_for(lambda: _asked(nc), what="the restarted inventory")
        finally:
            await nc.close()
        two = next(c for c in said["extra"]["cards"] if c["index"] == 2)
        stages = [step["stage"] for step in two["remediation"]["history"]]
        repaired = ["quarantined", "drained", "resetting", "checking", "serving"]
        assert stages == [*repaired, "quarantined", "drained", "retired"]
        assert said["node"]["cards"][2]["remedy"] == "retired"


async def test_a_restart_without_a_state_file_resumes_the_remediation_from_the_ledger(
    nats_server: NatsServer, allocator: RunningAllocator
) -> None:
    fake = fleet()
    api = allocator.stub()
    async with inventory(nats_server.url, fake, None):
        await faulted(api, fake, 2, 79, remedy="drain")

    async with publications(nats_server.url) as (nc, published):
        async with inventory(nats_server.url, fake, None):  # no state file: the ledger's remedy resumes
            said = await wait_for(lambda: _resumed(nc, 2), what="the restarted inventory resuming card 2")
            two = next(c for c in said["extra"]["cards"] if c["index"] == 2)
            assert two["remediation"]["stage"] == "quarantined" and two["health"]["state"] == "unhealthy"
            assert two["remediation"]["history"][0]["reason"].startswith("resumed from the ledger's remedy drain")
            assert fake.calls.get("gpu_reset", 0) == 0  # its process still runs: still draining

            fake.set_processes(2, [])
            await wait_for(lambda: _with(api, 2, health="healthy", remedy=""), what="card 2 back")
            assert fake.calls["gpu_reset"] == 1  # its XID 79 needs a reset, as the ledger's reason says
            fake.inject_xid(2, 79)
            await wait_for(lambda: _with(api, 2, remedy="retired"), what="card 2 retired")
        first = len(published)
        async with inventory(nats_server.url, fake, None):  # and a retired card stays retired
            said = await wait_for(lambda: _resumed(nc, 2), what="the inventory started again, card 2 resumed")
            assert said["node"]["cards"][2]["remedy"] == "retired"
            await wait_for(lambda: _published_after(published, first), what="its publication")
    # no publication ever said card 2 was healthy until it was repaired: the ledger kept its remedy
    twos = [m["node"]["cards"][2] for m in published]
    assert twos[0]["remedy"] == "drain" and twos[-1]["remedy"] == "retired"
    back = next(i for i, c in enumerate(twos) if c["health"] == "healthy")
    assert all(c["health"] == "unhealthy" and c.get("remedy") in ("drain", "reset") for c in twos[:back])
    assert all(c["health"] == "unhealthy" for c in twos[back:] if c.get("remedy"))
    assert all(c.get("remedy") == "retired" for c in twos[first:])


async def test_a_card_that_takes_no_new_work_stays_unhealthy_across_a_restart_without_a_state_file(
    nats_server: NatsServer, allocator: RunningAllocator
) -> None:
    """A fault that only stops new work sets no remedy in the ledger; a restart without a saved
    book keeps the card unhealthy from the ledger's health (it used to come back healthy), and
    no publication of the restarted inventory says otherwise."""
    fake = fleet()
    api = allocator.stub()
    async with inventory(nats_server.url, fake, None):
        before = await faulted(api, fake, 3, 1, health="unhealthy")  # contact support: no new work, nothing moved
        assert before.remedy == ""
    async with publications(nats_server.url) as (nc, published), inventory(nats_server.url, fake, None):
        three = await wait_for(lambda: _card_by_ledger(nc, 3), what="card 3 unhealthy, by the ledger")
        assert three["health"]["reason"] == before.health_reason
        await wait_for(lambda: _published_after(published, 0), what="a publication")
        after = await _with(api, 3)
        assert after is not None and after.health == "unhealthy" and after.remedy == ""
    assert all(m["node"]["cards"][3]["health"] == "unhealthy" for m in published)


class _SlowFirstScan(NvmlGpus):
    """NVML whose first scan takes a while: the ledger answers the restarted inventory first."""

    def __init__(self, fake: FakeNvml) -> None:
        super().__init__(fake, fake.numa_node, "fake")
        self.scans = 0

    def scan(self) -> Scan:
        self.scans += 1
        if self.scans == 1:
            time.sleep(1.5)
        return super().scan()


async def test_a_restarted_inventory_publishes_no_node_before_it_has_scanned_its_cards(
    nats_server: NatsServer, allocator: RunningAllocator
) -> None:
    """Before its first scan a restarted inventory knows no cards; publishing then would tell the
    ledger the node has none (and lose the health the ledger keeps for them). It publishes nothing
    until NVML has answered, whatever the ledger answers first."""
    fake = fleet()
    api = allocator.stub()
    async with inventory(nats_server.url, fake, None):
        await faulted(api, fake, 3, 1, health="unhealthy")
    async with publications(nats_server.url) as (_nc, published):
        slow = _SlowFirstScan(fake)
        async with inventory(nats_server.url, fake, None, slow):
            await wait_for(lambda: _published_after(published, 0), what="a publication")
            assert slow.scans >= 1
            after = await _with(api, 3)
            assert after is not None and after.health == "unhealthy"
    assert [len(m["node"]["cards"]) for m in published] == [8] * len(published)


async def _card_by_ledger(nc: Client, index: int) -> Any:
    said = await _asked(nc)
    card = next((c for c in said["extra"]["cards"] if c["index"] == index), None) if said else None
    return card if card is not None and card["health"]["by"] == "ledger" else None


async def _published_after(published: list[Any], first: int) -> bool:
    return len(published) > first


async def test_gpuledger_health_shows_a_card_s_stages_after_an_xid(
    nats_server: NatsServer, allocator: RunningAllocator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fleet()
    api = allocator.stub()
    async with inventory(nats_server.url, fake, tmp_path / "health.json"):
        await faulted(api, fake, 2, 79, remedy="drain")
        assert await _cli(nats_server.url) == 0  # the whole cluster, in short
        lines = capsys.readouterr().out.splitlines()
        assert lines[1].split()[:5] == ["gpu-a", "2", "unhealthy", "reset", "quarantined"]
        assert lines[-1] == "1 node(s), 8 card(s): 7 serving, 1 quarantined"

        fake.set_processes(2, [])
        await wait_for(lambda: _with(api, 2, health="healthy", remedy=""), what="card 2 back")
        assert await _cli(nats_server.url, "--node", "gpu-a", "--json") == 0
        two = json.loads(capsys.readouterr().out)["nodes"][0]["cards"][2]
        assert (two["health"], two["stage"], two["source"]) == ("healthy", "serving", "inventory")
        whats = [e["what"] for e in two["history"]]
        assert whats == ["fault", "quarantined", "drained", "resetting", "reset", "back", "healthy"]
        assert two["history"][0]["by"] == "xid" and two["history"][-1]["by"] == "rule:remediation"

        assert await _cli(nats_server.url, "--node", "gpu-a", "--card", "2") == 0
        text = capsys.readouterr().out
        assert "card 2 (" in text and "checked: back in service" in text


async def test_an_operator_s_word_always_wins_and_is_logged(
    nats_server: NatsServer, allocator: RunningAllocator, caplog: pytest.LogCaptureFixture
) -> None:
    fake = fleet()
    api = allocator.stub()
    async with inventory(nats_server.url, fake, None):
        await faulted(api, fake, 2, 79, remedy="drain")
        mark = ("--node", "gpu-a", "--by", "ana", "--note", "riser replaced")
        assert await _cli(nats_server.url, *mark, "--card", "2", "--healthy") == 0  # while draining
        await wait_for(lambda: _with(api, 2, health="healthy", remedy=""), what="card 2 healed by ana")
        assert await _cli(nats_server.url, *mark, "--card", "3", "--unhealthy") == 0  # while serving
        await wait_for(lambda: _with(api, 3, health="unhealthy", remedy=""), what="card 3 out (no new work)")
        assert await _cli(nats_server.url, *mark, "--card", "4", "--retire") == 0  # while serving
        await wait_for(lambda: _with(api, 4, remedy="retired"), what="card 4 retired (empty: at once)")

        nc = await bus.connect(nats_server.url, "test")
        try:
            said = await wait_for(lambda: _asked(nc), what="the inventory")
        finally:
            await nc.close()
    cards = {c["index"]: c for c in said["extra"]["cards"]}
    assert cards[2]["remediation"]["history"][-1]["reason"] == "healed by operator:ana"
    assert (cards[3]["remediation"]["stage"], cards[3]["health"]["by"]) == ("faulted", "operator:ana")
    assert [(s["stage"], s["reason"]) for s in cards[4]["remediation"]["history"]] == [
        ("faulted", "riser replaced"),  # no new work at once
        ("quarantined", "retired by operator:ana (riser replaced)"),
        ("drained", "no holder and no process"),
        ("retired", "drained; its fault retires it"),
    ]
    assert fake.calls.get("gpu_reset", 0) == 0  # a retired card is not reset
    for word in ("2 (GPU-", "3 (GPU-", "4 (GPU-"):
        assert f"operator ana marks card {word}" in caplog.text
    assert "remediation serving (healed by operator:ana)" in caplog.text


async def test_the_dashboard_shows_a_card_s_history_asked_of_its_inventory(
    nats_server: NatsServer, allocator: RunningAllocator, tmp_path: Path
) -> None:
    """GET /api/nodes/<node>/cards/<uuid>/history: the allocator asks the node's inventory; a
    name that is not one is refused (400), an unknown node or card is not found (404), and an
    inventory that does not answer is said to, with what the ledger shows."""
    fake = fleet()
    api = allocator.stub()
    nodes = f"http://127.0.0.1:{allocator.http_port()}/api/nodes"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async with inventory(nats_server.url, fake, tmp_path / "health.json"):
            uuid = (await wait_for(lambda: _with(api, 2, health="healthy"), what="gpu-a in the ledger")).uuid
            history = f"{nodes}/gpu-a/cards/{uuid}/history"
            fake.inject_xid(2, 79)
            await wait_for(lambda: _with(api, 2, remedy="drain"), what="card 2 to be drained")
            status, body = await _get(http, history)
            assert (status, body["stage"], body["problem"]) == (200, "quarantined", "")
            assert [e["what"] for e in body["history"]] == ["fault", "quarantined"]

            fake.set_processes(2, [])
            await wait_for(lambda: _with(api, 2, health="healthy", remedy=""), what="card 2 back")
            status, body = await _get(http, history)
            assert (status, body["health"], body["stage"], body["source"]) == (200, "healthy", "serving", "inventory")
            whats = [e["what"] for e in body["history"]]
            assert whats == ["fault", "quarantined", "drained", "resetting", "reset", "back", "healthy"]
            fault, back = body["history"][0], body["history"][-2]
            assert (fault["by"], back["by"]) == ("xid", "rule:remediation") and fault["reason"].startswith("XID 79")
            assert all(e["at"] > 0 for e in body["history"])

            for path, code, word in (
                (f"{nodes}/gpu-*/cards/{uuid}/history", 400, "node: "),
                (f"{nodes}/GPU-A/cards/{uuid}/history", 400, "node: "),
                (f"{nodes}/gpu-a/cards/card-2/history", 400, "uuid: "),
                (f"{nodes}/gpu-b/cards/{uuid}/history", 404, "not in the ledger"),
                (f"{nodes}/gpu-a/cards/GPU-0000/history", 404, "not on node"),
            ):
                status, body = await _get(http, path)
                assert status == code and word in body["error"], (path, body)

        status, body = await _get(http, history)  # its inventory stopped: the ledger's word
    assert (status, body["source"], body["history"]) == (200, "ledger", [])
    assert body["problem"] == "history unavailable: the node's inventory did not answer"
    assert body["health"] == "healthy" and body["uuid"] == uuid


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as reply:
        return reply.status, await reply.json()


async def _cli(url: str, *argv: str) -> int:
    args = parser().parse_args(["health", "--nats-url", url, *argv])
    code: int = await args.run(args)
    return code


async def _asked(nc: Client) -> Any:
    """The inventory's answer once it has scanned its cards (a start answers before it has)."""
    with contextlib.suppress(Unavailable):
        said = await bus.request(nc, inventory_api.get_subject("gpu-a"), {})
        return said if said["extra"]["cards"] and said["node"]["cards"] else None
    return None


async def _resumed(nc: Client, index: int) -> Any:
    """The inventory's answer once card ``index`` has left serving and healthy: it answers requests
    from its start, before it has read the node's ledger and resumed the remedies there."""
    said = await _asked(nc)
    card = next((c for c in said["extra"]["cards"] if c["index"] == index), None) if said else None
    if card is None or card["remediation"]["stage"] == "serving" or card["health"]["state"] == "healthy":
        return None
    return said


async def _with(api: pb.AllocatorStub, index: int, **want: str) -> pb.CardStatus | None:
    card = (await cards(api)).get(index)
    if card is None or any(getattr(card, k) != v for k, v in want.items()):
        return None
    return card
