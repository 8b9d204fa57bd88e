"""The shim as a process and its ops endpoints: /healthz, /readyz, /metrics, SIGTERM -> 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from gpuledger_core.ledger import NodeLedger
from gpuledger_dev.fake_kubelet import FakeContainer, FakeKubelet
from gpuledger_dev.natsserver import NatsServer, free_port

from .conftest import CARDS, NODE, SLOTS, Stack, make_node, pod, share

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_ops_endpoints(stack: Stack) -> None:
    p = pod("p", FakeContainer("main", gpus=1))
    await stack.reserve(p, {"main": (share(0),)})
    await stack.kubelet.admit(p)
    base = f"http://127.0.0.1:{stack.plugin.http_port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/healthz") as health:
            assert health.status == 200
        async with http.get(f"{base}/readyz") as ready:
            assert ready.status == 200, await ready.text()
        async with http.get(f"{base}/metrics") as metrics:
            text = await metrics.text()
    assert "gpuledger_plugin_allocate_seconds_bucket" in text
    assert "# HELP gpuledger_plugin_reconcile_mismatches_total" in text
    assert f'gpuledger_plugin_devices{{health="healthy"}} {float(CARDS * SLOTS)}' in text


async def test_sigterm_stops_the_process_cleanly(dirs: Path, nats_server: NatsServer) -> None:
    from gpuledger_common import bus
    from gpuledger_common.store import LedgerStore

    nc = await bus.connect(nats_server.url, "test")
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: NodeLedger(make_node()))
    kubelet = FakeKubelet(str(dirs / "dp"), str(dirs / "pr.sock"))
    await kubelet.start()
    env = {
        **os.environ,
        "GPULEDGER_NODE": NODE,
        "GPULEDGER_NATS_URL": nats_server.url,
        "GPULEDGER_DEVICE_PLUGIN_DIR": str(dirs / "dp"),
        "GPULEDGER_POD_RESOURCES_SOCKET": str(dirs / "pr.sock"),
        "GPULEDGER_HTTP_HOST": "127.0.0.1",
        "GPULEDGER_HTTP_PORT": str(free_port()),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuledger_plugin",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await kubelet.wait_for(
            lambda k: k.registrations == 1 and len(k.healthy()) == 8 * CARDS, within=20
        )
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            code = await process.wait()
        assert code == 0
        assert not (dirs / "dp" / "gpuledger.sock").exists()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await kubelet.stop()
        await nc.close()
