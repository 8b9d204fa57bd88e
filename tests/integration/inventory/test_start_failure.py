"""A part of the inventory that cannot start (its HTTP port taken) stops every part started before
it: the NATS subjects and the connection are closed, no task runs on."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from gpuledger_dev.fake_nvml import FakeNvml
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import node_script
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.app import serve
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.settings import InventorySettings

from ..leftovers import Before, in_use, taken_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
FLEET = "nodes:\n  - name: gpu-a\n    profile: rtx3090-1\n"


async def test_a_taken_http_port_stops_what_had_started(nats_server: NatsServer) -> None:
    fake = FakeNvml(node_script(parse_fleet(FLEET, "fleet.yaml"), "gpu-a"))
    gpus = NvmlGpus(fake, fake.numa_node, "fake")
    with taken_port() as port:
        settings = InventorySettings(
            node="gpu-a", nats_url=nats_server.url, http_host="127.0.0.1", http_port=port, kube="off"
        )
        before = Before.now()
        with pytest.raises((OSError, ExceptionGroup)) as caught:
            await asyncio.wait_for(serve(settings, gpus=gpus, stop=asyncio.Event()), 30)
        assert in_use(caught.value), caught.value
        await before.nothing_left()


@pytest.mark.parametrize(
    ("kube", "said"),
    [
        ("auto", "cannot start: kube: mode dra (the node's ResourceSlices) needs Kubernetes, but kube is auto"),
        ("on", "bad setting: kube: 'on' is not a mode; use in-cluster or kubeconfig"),
    ],
)
async def test_dra_mode_without_kubernetes_stops_at_start_saying_why(tmp_path: Path, kube: str, said: str) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "GPULEDGER_KUBECONFIG")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuledger_inventory", "--mode", "dra", "--kube", kube, "--node", "gpu-a",
        "--fake-fleet", str(fleet), "--nats", "nats://127.0.0.1:1",
        env=env, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2, err.decode()
    assert said in err.decode() and "Traceback" not in err.decode()
