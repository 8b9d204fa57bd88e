"""A service given the cluster's server list starts while one server is down, and its logs name the
server it actually reached, on connect and on reconnect, never the dead one."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from urllib.parse import urlsplit

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.store import LedgerStore
from gpuledger_dev.natsserver import free_port
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.nats_cluster import NatsCluster
from tests.support.replicas import running_allocator, wait_for

from .conftest import NATS_RECONNECT_LEAK, REPLICAS, all_current, first_server_down

pytestmark = [pytest.mark.timeout(90), NATS_RECONNECT_LEAK]


def port_of(nc: Client) -> int:
    url = nc.connected_url
    assert url is not None and url.port is not None
    return url.port


async def test_the_log_names_the_server_reached(cluster: NatsCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuledger_common.bus")
    dead = f"nats://127.0.0.1:{free_port()}"  # listed, never up
    nc = await bus.connect(f"{dead},{cluster.url}", "log-test")
    try:
        first = port_of(nc)
        assert f"nats connected to nats://127.0.0.1:{first} (of {dead},{cluster.url})" in caplog.text
        caplog.clear()
        await cluster.kill(next(m.name for m in cluster.members if m.port == first))

        async def reconnected() -> bool:
            return nc.is_connected and port_of(nc) != first

        await wait_for(reconnected, 20, "a reconnect to another server")
        second = port_of(nc)
        await wait_for(lambda: _logged(caplog, f"nats reconnected to nats://127.0.0.1:{second}"), 5, "the log line")
        assert f"nats disconnected from nats://127.0.0.1:{first}" in caplog.text
        assert f"reconnected to nats://127.0.0.1:{first}" not in caplog.text
    finally:
        await nc.close()


async def _logged(caplog: pytest.LogCaptureFixture, line: str) -> bool:
    return line in caplog.text


async def test_an_allocator_starts_while_a_server_of_its_list_is_down(cluster: NatsCluster, cluster_nc: Client) -> None:
    await LedgerStore.open(cluster_nc, replicas=REPLICAS)  # the buckets exist, as after an install
    await all_current(cluster, cluster_nc, 20)
    down = await first_server_down(cluster, cluster_nc)
    async with running_allocator(cluster.url, bucket_replicas=REPLICAS) as allocator:
        assert urlsplit(allocator.settings.nats_url.split(",")[0]).port == down.port
        reply = await allocator.stub().get_cluster(pb.GetClusterRequest())
        assert reply.nodes == []  # it answers: connected to a server that is up, buckets made


async def test_an_allocator_waiting_for_nats_stops_on_sigterm() -> None:
    """No server of its list is up: it keeps trying (as it should at start), and SIGTERM ends it
    cleanly, as it would in a pod being deleted."""
    servers = f"nats://127.0.0.1:{free_port()},nats://127.0.0.1:{free_port()}"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuledger_allocator", "--nats-url", servers, "--kube", "off",
        "--grpc-port", "0", "--http-port", "0",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    try:
        seen = b""
        while b"nats error" not in seen:  # it is trying the servers
            seen += await asyncio.wait_for(process.stderr.readline(), 20)
        process.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(process.communicate(), 10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = (seen + rest).decode()
    assert process.returncode == 0, text
    assert "stopped before NATS answered" in text and "Traceback" not in text
