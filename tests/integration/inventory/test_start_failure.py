"""A part of the inventory that cannot start (its HTTP port taken) stops every part started before
it: the NATS subjects and the connection are closed, no task runs on."""

from __future__ import annotations

import asyncio

import pytest

from gpuledger_common.fleet import parse_fleet
from gpuledger_common.natsserver import NatsServer
from gpuledger_inventory.app import serve
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.settings import InventorySettings
from gpuledger_testing.fake_nvml import FakeNvml
from gpuledger_testing.fleet_sim import node_sim

from ..leftovers import Before, in_use, taken_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
FLEET = "nodes:\n  - name: gpu-a\n    profile: rtx3090-1\n"


async def test_a_taken_http_port_stops_what_had_started(nats_server: NatsServer) -> None:
    fake = FakeNvml(node_sim(parse_fleet(FLEET, "fleet.yaml"), "gpu-a"))
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
