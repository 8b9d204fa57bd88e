from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.natsserver import NatsServer, embedded_nats


@pytest.fixture
async def nats_server() -> AsyncIterator[NatsServer]:
    async with embedded_nats() as server:
        yield server


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    client = await bus.connect(nats_server.url, "test")
    yield client
    await client.close()
