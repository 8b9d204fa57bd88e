"""gpuledger-placement as a process: settings from the environment, ops endpoints, SIGTERM -> 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp
import pytest

from gpuledger_dev.natsserver import NatsServer, free_port
from tests.support.replicas import RunningAllocator, wait_for

from .helpers import args, gpu_pod, post

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_the_process_serves_and_stops_cleanly_on_sigterm(
    nats_server: NatsServer, allocator: RunningAllocator
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "GPULEDGER_NATS_URL": nats_server.url,
        "GPULEDGER_HTTP_HOST": "127.0.0.1",
        "GPULEDGER_HTTP_PORT": str(port),
        "GPULEDGER_KUBE": "off",
        "GPULEDGER_STALE_AFTER_S": "0",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuledger_placement",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:

            async def ready() -> bool:
                async with http.get(f"{base}/readyz") as reply:
                    return reply.status == 200

            await wait_for(ready, timeout=20, what="placement ready")
            status, body = await post(http, f"{base}/gpuledger/filter", args(gpu_pod("p", gpu=8), ["h100-0", "p4-0"]))
            assert status == 200 and body["NodeNames"] == ["h100-0"]
            async with http.get(f"{base}/metrics") as reply:
                text = await reply.text()
            assert 'gpuledger_placement_extender_seconds_count{verb="filter"}' in text
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            code = await process.wait()
        assert process.stderr is not None
        log = (await process.stderr.read()).decode()
        assert code == 0, log
        assert "gpuledger-placement starting with" in log and "stopped" in log
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_bad_setting_stops_it_at_once_naming_the_field() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuledger_placement", "--guard", "lots", stderr=asyncio.subprocess.PIPE
    )
    _, err = await process.communicate()
    assert process.returncode == 2
    assert b"guard: must be off or <cores>:<GiB>" in err
