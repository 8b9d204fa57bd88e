"""The DRA plugin's device health over its real unix socket, as kubelet asks for it
(``/v1alpha1.DRAResourceHealth/NodeWatchResources``), fed by the node's ledger in a real
nats-server: every device of the pool at once, and a card the inventory marks unhealthy turns up
unhealthy in the open stream; the stream ends when the plugin stops."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel

from gpuledger_common import bus
from gpuledger_common.store import LedgerStore
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Health
from gpuledger_dev.natsserver import NatsServer
from gpuledger_plugin.dra.app import running
from gpuledger_plugin.dra.settings import DraSettings
from gpuledger_proto import v1alpha1 as pb
from tests.support.waiting import polled, wait_for

from .conftest import NODE, make_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Claims:
    """The API server's claims: none is asked for here."""

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        raise AssertionError("not asked")

    async def node_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        raise AssertionError("not asked")

    async def close(self) -> None:
        return None


def plugin_settings(dirs: Path, nats_server: NatsServer) -> DraSettings:
    return DraSettings(
        node=NODE,
        nats_url=nats_server.url,
        registry_dir=str(dirs / "registry"),
        plugin_dir=str(dirs / "plugins"),
        cdi_dir=str(dirs / "cdi"),
        http_host="127.0.0.1",
        http_port=0,
    )


def health_of(answer: pb.NodeWatchResourcesResponse) -> dict[str, tuple[pb.HealthStatus, str]]:
    assert {d.device.pool_name for d in answer.devices} == {NODE}
    return {d.device.device_name: (d.health, d.message) for d in answer.devices}


def unhealthy(index: int, reason: str) -> Any:
    def transition(ledger: NodeLedger | None) -> NodeLedger:
        assert ledger is not None
        cards = tuple(
            dataclasses.replace(c, health=Health.UNHEALTHY, health_reason=reason) if c.index == index else c
            for c in ledger.node.cards
        )
        return NodeLedger(dataclasses.replace(ledger.node, cards=cards), ledger.allocations)

    return transition


async def next_where(
    stream: AsyncIterator[pb.NodeWatchResourcesResponse], wanted: Any
) -> pb.NodeWatchResourcesResponse:
    """The first answer of ``stream`` that ``wanted`` accepts (the ledger's first value may come
    after the stream opened: an earlier answer may be empty)."""
    async for answer in stream:
        if wanted(answer):
            return answer
    raise AssertionError("the stream ended")


async def test_a_card_turning_unhealthy_shows_in_kubelets_open_stream(dirs: Path, nats_server: NatsServer) -> None:
    nc = await bus.connect(nats_server.url, "test")
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: NodeLedger(make_node()))
    settings = dataclasses.replace(plugin_settings(dirs, nats_server), health_resend_s=3600.0, health_timeout_s=7200)
    try:
        async with running(settings, api=Claims()):
            channel = Channel(path=settings.dra_socket)
            try:
                stub = pb.DraResourceHealthStub(channel)
                stream = stub.node_watch_resources(pb.NodeWatchResourcesRequest())
                first = await asyncio.wait_for(next_where(stream, lambda a: len(a.devices) > 0), 20)
                assert health_of(first) == {f"gpu-{i}": (pb.HealthStatus.HEALTHY, "") for i in range(4)}
                assert {d.health_check_timeout_seconds for d in first.devices} == {7200}
                await store.mutate(NODE, unhealthy(2, "XID 79: fallen off the bus"))
                changed = await asyncio.wait_for(next_where(stream, lambda a: a.devices != first.devices), 20)
                found = health_of(changed)
                assert found["gpu-2"] == (pb.HealthStatus.UNHEALTHY, "card 2 (GPU-card-2): XID 79: fallen off the bus")
                assert {name for name, (h, _) in found.items() if h == pb.HealthStatus.HEALTHY} == {
                    "gpu-0",
                    "gpu-1",
                    "gpu-3",
                }
            finally:
                channel.close()
    finally:
        await nc.close()


async def test_the_stream_says_it_again_and_stays_open_until_kubelet_closes_it(
    dirs: Path, nats_server: NatsServer
) -> None:
    nc = await bus.connect(nats_server.url, "test")
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: NodeLedger(make_node()))
    settings = dataclasses.replace(plugin_settings(dirs, nats_server), health_resend_s=0.2, health_timeout_s=2)
    answers: list[pb.NodeWatchResourcesResponse] = []
    try:
        async with running(settings, api=Claims()) as plugin:
            channel = Channel(path=settings.dra_socket)
            try:
                stub = pb.DraResourceHealthStub(channel)

                async def watch() -> None:
                    async for answer in stub.node_watch_resources(pb.NodeWatchResourcesRequest()):
                        answers.append(answer)

                watching = asyncio.create_task(watch())
                await wait_for(polled(lambda: sum(1 for a in answers if a.devices) >= 3), 10, "the list said again")
                assert not watching.done()
                assert len({bytes(a) for a in answers if a.devices}) <= 2  # the same list (its time may tick)
                assert plugin.health.watchers == 1
                watching.cancel()  # kubelet closes the stream
                await wait_for(polled(lambda: plugin.health.watchers == 0), 10, "the plugin end closed")
            finally:
                channel.close()
    finally:
        await nc.close()
