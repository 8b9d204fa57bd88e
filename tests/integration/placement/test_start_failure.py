"""A part of placement that cannot start (the extender's HTTPS port taken, the last part to start)
stops every part started before it: the ops port is free again, NATS is closed, no task runs on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuledger_dev.extender_pki import ExtenderPki
from gpuledger_dev.natsserver import NatsServer, free_port
from gpuledger_placement.app import serve
from gpuledger_placement.settings import PlacementSettings
from tests.support.replicas import RunningAllocator

from ..leftovers import Before, free, in_use, taken_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_taken_extender_port_stops_what_had_started(
    nats_server: NatsServer, allocator: RunningAllocator, tmp_path: Path
) -> None:
    pki, http_port = ExtenderPki(tmp_path / "pki"), free_port()
    with taken_port() as port:
        settings = PlacementSettings(
            nats_url=nats_server.url,
            http_host="127.0.0.1",
            http_port=http_port,
            extender_port=port,
            extender_cert_file=str(pki.server.cert),
            extender_key_file=str(pki.server.key),
            extender_client_ca_file=str(pki.ca.cert),
            kube="off",
        )
        before = Before.now()
        with pytest.raises((OSError, ExceptionGroup)) as caught:
            await asyncio.wait_for(serve(settings, asyncio.Event()), 30)
        assert in_use(caught.value), caught.value
        await before.nothing_left()
    assert free(http_port)  # the ops port had started, and was closed
