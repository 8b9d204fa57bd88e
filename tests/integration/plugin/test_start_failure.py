"""A part of the plugin shim that cannot start (its HTTP port taken, the last part to start) stops
every part started before it, in both modes: the loops (kubelet's link among them), the DRA
socket and its file, the API server's client, NATS; no task runs on."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuledger_common import bus
from gpuledger_common.store import LedgerStore
from gpuledger_dev.natsserver import NatsServer
from gpuledger_plugin.app import serve
from gpuledger_plugin.dra.app import running as running_dra
from gpuledger_plugin.dra.settings import DraSettings

from ..leftovers import Before, in_use, taken_port
from .conftest import settings_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_taken_http_port_stops_what_had_started(dirs: Path, nats_server: NatsServer) -> None:
    nc = await bus.connect(nats_server.url, "test")
    try:
        await LedgerStore.open(nc)  # the buckets the plugin waits for
        with taken_port() as port:
            settings = settings_for(dirs, nats_server.url, http_port=port)
            before = Before.now()
            with pytest.raises((OSError, ExceptionGroup)) as caught:
                await asyncio.wait_for(serve(settings, asyncio.Event()), 30)
            assert in_use(caught.value), caught.value
            await before.nothing_left()
    finally:
        await nc.close()


class Claims:
    """The API server's claims, never asked here: only whether the client was closed."""

    closed = False

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        raise AssertionError("not asked")

    async def node_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        raise AssertionError("not asked")

    async def close(self) -> None:
        self.closed = True


async def test_in_dra_mode_a_taken_http_port_stops_what_had_started(dirs: Path) -> None:
    claims = Claims()
    with taken_port() as port:
        settings = DraSettings(
            node="n1",
            registry_dir=str(dirs / "registry"),
            plugin_dir=str(dirs / "plugins"),
            cdi_dir=str(dirs / "cdi"),
            ledger_check=False,
            http_host="127.0.0.1",
            http_port=port,
        )
        before = Before.now()
        with pytest.raises((OSError, ExceptionGroup)) as caught:
            async with running_dra(settings, api=claims):
                raise AssertionError("started with its port taken")
        assert in_use(caught.value), caught.value
        await before.nothing_left()
    assert claims.closed
    assert not await asyncio.to_thread(os.path.exists, settings.dra_socket)  # it had started, and was removed


def outside_a_pod() -> dict[str, str]:
    """This process's environment, less what would make ``auto`` find a pod or a kubeconfig."""
    gone = ("KUBERNETES_SERVICE_HOST", "GPULEDGER_KUBE", "GPULEDGER_KUBECONFIG", "GPULEDGER_MODE")
    return {name: value for name, value in os.environ.items() if name not in gone}


async def test_the_dra_plugin_without_kubernetes_stops_at_start_saying_why(dirs: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuledger_plugin", "--mode", "dra", "--node", "n1",
        "--nats-url", "nats://127.0.0.1:1", "--registry-dir", str(dirs / "registry"),
        env=outside_a_pod(), stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2, err.decode()
    assert "cannot start: kube: the DRA plugin needs Kubernetes, but kube is auto and found no pod's" in err.decode()
    assert "Traceback" not in err.decode()
