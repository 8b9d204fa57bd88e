"""docker compose up of deploy/compose (with offline.yaml) on a real dockerd, used as a person would.

Traffic stays on the compose network and the host's loopback: the ports are published on
127.0.0.1 only, and the containers reach no registry (the images are built beforehand).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.support.browser import chromium
from tests.support.engine.compose_stack import IN_CONTAINER_GRPC, ComposeStack
from tests.support.waiting import wait_for

from .cli import holders, host
from .conftest import TIMINGS

pytestmark = pytest.mark.timeout(300)

SERVICES = {
    "nats",
    "allocator",
    "placement",
    "inventory-rtx-0",
    "inventory-p4-0",
    "inventory-h100-0",
    "inventory-a100-mig-0",
}
ONE_SHOT = {"credentials"}
LOG_LINE = re.compile(r"^(?P<service>[a-z0-9-]+?)-1\s+\| (?P<text>.*)$")


def alloc_json(out: str) -> dict[str, object]:
    allocation: dict[str, object] = json.loads(out)["allocation"]
    return allocation


def test_every_service_is_healthy_by_its_health_check(stack: ComposeStack) -> None:
    found = stack.services()
    assert set(found) == SERVICES | ONE_SHOT
    for name in ONE_SHOT:
        assert (found.pop(name)["State"], stack.inspect(name, "{{.State.ExitCode}}")) == ("exited", "0")
    for name, row in found.items():
        assert (row["State"], row["Health"]) == ("running", "healthy"), name
        assert stack.inspect(name, "{{.HostConfig.RestartPolicy.Name}}") == "unless-stopped"
        assert stack.inspect(name, "{{.Config.User}}") == "10001:10001", f"{name} runs as root"


def test_inspect_and_alloc_from_the_host_on_the_published_port(stack: ComposeStack) -> None:
    table = host("inspect", *stack.grpc_flags)
    assert table.returncode == 0, table.stderr
    assert "4 node(s), 15 card(s)" in table.stdout
    made = host(
        "alloc", *stack.grpc_flags, "--gpu", "1", "--gpu-mem", "4096", "--owner", "host-tool", "--json"
    )
    assert made.returncode == 0, made.stderr
    allocation = alloc_json(made.stdout)
    seen = host("inspect", *stack.grpc_flags, "--json")
    assert any(h[0] == allocation["id"] and h[1] == "host-tool" and h[4] == 4096 for h in holders(seen.stdout))


def test_inspect_and_alloc_from_a_container_over_the_compose_network(stack: ComposeStack) -> None:
    made = stack.run(
        "cli", "gpuledger", "alloc", *IN_CONTAINER_GRPC, "--gpu", "1", "--gpu-mem", "2048",
        "--owner", "container-tool", "--json",
    )
    assert made.returncode == 0, made.stderr
    allocation = alloc_json(made.stdout)
    seen = stack.run("cli", "gpuledger", "inspect", "--server", "allocator:50051", "--json")  # TLS files: its env
    assert seen.returncode == 0, seen.stderr
    assert any(h[0] == allocation["id"] and h[1] == "container-tool" for h in holders(seen.stdout))
    # and the host sees the same ledger
    assert allocation["id"] in {h[0] for h in holders(host("inspect", *stack.grpc_flags, "--json").stdout)}


def test_the_grpc_api_takes_only_the_admins_certificate(stack: ComposeStack) -> None:
    flags = stack.grpc_flags
    ca_only = flags[: flags.index("--cert-file")]
    for refused in (["--server", stack.grpc_address], ca_only):
        done = host("inspect", *refused)
        assert done.returncode != 0, refused
    assert host("inspect", *flags).returncode == 0


NATS_PROBE = """
import asyncio, ssl, sys, nats
async def main(url, user, password):
    tls = ssl.create_default_context(cafile="/credentials/ca.crt") if url.startswith("tls") else None
    try:
        nc = await nats.connect(url, user=user or None, password=password or None, tls=tls,
                                connect_timeout=3, max_reconnect_attempts=0, allow_reconnect=False)
    except Exception as err:
        print("refused:", type(err).__name__, err)
        return
    await nc.close()
    print("connected")
asyncio.run(main(*sys.argv[1:4]))
"""


def test_nats_takes_only_its_users_and_only_over_tls(stack: ComposeStack) -> None:
    password = stack.exec("placement", "cat", "/credentials/nats-password").stdout.strip()
    assert password
    cases = {
        ("tls://nats:4222", "placement", password): "connected",
        ("tls://nats:4222", "", ""): "refused",
        ("tls://nats:4222", "placement", "not-its-password"): "refused",
        ("nats://nats:4222", "placement", password): "refused",  # no TLS, no connection
    }
    for (url, user, secret), expected in cases.items():
        done = stack.exec("placement", "python3", "-c", NATS_PROBE, url, user, secret)
        assert done.stdout.startswith(expected), (url, user, done.stdout, done.stderr)


def _own_credentials() -> dict[str, tuple[str, set[str]]]:
    """Each running service: where its credentials are mounted, and the files it must hold there."""
    own = {"nats": ("/etc/nats/credentials", {"ca.crt", "nats.crt", "nats.key", "auth.conf"})}
    for server in ("allocator", "placement"):
        own[server] = ("/credentials", {"ca.crt", f"{server}.crt", f"{server}.key", "nats-password"})
    for name in SERVICES - set(own):
        own[name] = ("/credentials", {"ca.crt", "nats-password"})
    return own


def test_each_container_holds_only_its_own_credentials(stack: ComposeStack, tmp_path: Path) -> None:
    """No container mounts another's credentials: an inventory holds no admin key and no other
    user's password, placement not the allocator's key. Each password held is compared with the
    originals, copied from the credentials service's own volume."""
    own = _own_credentials()
    for service, (where, files) in own.items():
        mounted = json.loads(stack.inspect(service, "{{json .Mounts}}"))
        volumes = {m["Name"] for m in mounted if m["Type"] == "volume" and "credentials" in m["Name"]}
        assert volumes == {f"{stack.project}_credentials-{service}"}, service
        listed = stack.exec(service, "ls", "-A", where)
        assert listed.returncode == 0, listed.stderr
        assert set(listed.stdout.split()) == files, service
    for elsewhere in ("/credentials/all", "/credentials/admin", "/credentials/tls", "/credentials/nats"):
        assert stack.exec("inventory-rtx-0", "ls", elsewhere).returncode != 0, elsewhere
    store = tmp_path / "all"
    stack.docker_cmd("cp", f"{stack.container('credentials')}:/credentials/all/.", str(store))
    for service, (where, files) in own.items():
        if "nats-password" in files:
            held = stack.exec(service, "cat", f"{where}/nats-password").stdout.strip()
            assert held == (store / "nats" / "passwords" / service).read_text().strip(), service


async def test_the_dashboard_is_served_to_the_host_and_follows_the_ledger(stack: ComposeStack) -> None:
    async with chromium() as page:
        await page.goto(stack.dashboard_url)
        cards = "document.querySelector('[data-tile=cards] .value')?.textContent"
        assert await page.wait_for(f"{cards} === '15' && {cards}", timeout=20)
        await page.wait_for("document.getElementById('live').className === 'on'", timeout=20)
        made = await asyncio.to_thread(
            host, "alloc", *stack.grpc_flags, "--gpu", "1", "--gpu-mem", "1000", "--owner",
            "dashboard-watcher", "--node", "p4-0", "--json",
        )
        assert made.returncode == 0, made.stderr
        allocation = alloc_json(made.stdout)
        assert allocation["node"] == "p4-0"
        await page.evaluate("location.hash = '#/node/p4-0'")
        held = await page.wait_for(
            "[...document.querySelectorAll('.card[data-node=\"p4-0\"] .seg')].map(s => s.title)"
            ".find(t => t.includes('dashboard-watcher'))",
            timeout=20,
        )
        assert held == "tool:dashboard-watcher: 1.0 GiB (1,000 MiB)"
        summary = await page.evaluate("document.getElementById('summary').textContent")
        assert summary.startswith("p4-0: 2 cards, ")
        shot = os.environ.get("GPULEDGER_SCREENSHOT")  # for a person to look at
        if shot:
            image = await page.screenshot()
            await asyncio.to_thread(_write, shot, image)


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as out:
        out.write(data)


async def _ledger(stack: ComposeStack) -> set[tuple[str, str, str, int, int]] | None:
    seen = await asyncio.to_thread(host, "inspect", *stack.grpc_flags, "--json")
    return holders(seen.stdout) if seen.returncode == 0 else None


async def _healthy_again(stack: ComposeStack, service: str, restarts: int) -> bool:
    state = await asyncio.to_thread(stack.inspect, service, "{{.RestartCount}} {{.State.Health.Status}}")
    count, health = state.split()
    return int(count) > restarts and health == "healthy"


async def test_a_killed_allocator_is_restarted_by_its_policy_and_keeps_every_allocation(stack: ComposeStack) -> None:
    made = host("alloc", *stack.grpc_flags, "--gpu", "2", "--owner", "before-the-kill", "--json")
    assert made.returncode == 0, made.stderr
    before = await _ledger(stack)
    assert before and any(h[1] == "before-the-kill" for h in before)
    restarts = int(stack.inspect("allocator", "{{.RestartCount}}"))
    os.kill(int(stack.inspect("allocator", "{{.State.Pid}}")), signal.SIGKILL)  # no clean shutdown
    started = asyncio.get_running_loop().time()
    await wait_for(lambda: _healthy_again(stack, "allocator", restarts), timeout=120, what="allocator restarted")
    TIMINGS["allocator SIGKILLed until healthy again (s)"] = asyncio.get_running_loop().time() - started
    assert await wait_for(lambda: _ledger(stack), timeout=30, what="the ledger") == before


async def test_nats_recreated_on_its_named_volume_keeps_the_ledger(stack: ComposeStack) -> None:
    before = await _ledger(stack)
    assert before
    old = stack.container("nats")
    await asyncio.to_thread(stack.compose, "up", "--detach", "--no-deps", "--force-recreate", "--wait", "nats")
    assert stack.container("nats") != old  # a new container, the same volume
    assert await wait_for(lambda: _ledger(stack), timeout=60, what="the ledger after NATS came back") == before


def test_logs_are_one_line_per_event_under_the_service_name(stack: ComposeStack) -> None:
    lines = stack.logs("allocator", "placement", "inventory-rtx-0")
    parsed = [LOG_LINE.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed, strict=True) if not m][:5]
    by_service: dict[str, list[str]] = {}
    for match in parsed:
        assert match
        by_service.setdefault(match["service"], []).append(match["text"])
    assert set(by_service) == {"allocator", "placement", "inventory-rtx-0"}
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+: ")
    for service, texts in by_service.items():
        strays = [t for t in texts if not stamp.match(t)]
        assert not strays, f"{service}: lines that are not one event each: {strays[:5]}"
    assert any("starting with" in t for t in by_service["allocator"])  # the effective settings, one line


def test_down_with_volumes_leaves_nothing_running(stack: ComposeStack) -> None:
    stack.down()
    assert stack.leftovers() == {"containers": [], "volumes": [], "networks": []}

