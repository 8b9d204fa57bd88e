from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.natsserver import NatsServer
from tests.support.replicas import RunningAllocator, RunningPlacement, running_placement


@pytest.fixture
async def placement(
    nats_server: NatsServer, allocator: RunningAllocator, apiserver: FakeApiServer, tmp_path: Path
) -> AsyncIterator[RunningPlacement]:
    config = apiserver.kubeconfig(tmp_path / "kubeconfig")
    async with running_placement(nats_server.url, kube="kubeconfig", kubeconfig=str(config)) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session
