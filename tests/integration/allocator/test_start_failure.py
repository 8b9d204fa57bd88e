"""A part of the allocator that cannot start (its HTTP port taken, the last part to start) stops
every part started before it: gRPC's port is free again, NATS is closed, no task runs on. A
running allocator whose task is cancelled stops every part as well."""

from __future__ import annotations

import asyncio

import pytest

from gpuledger_allocator.app import serve
from gpuledger_allocator.settings import AllocatorSettings
from gpuledger_allocator.view import ClusterView
from gpuledger_dev.natsserver import NatsServer, free_port
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, answers, wait_for

from ..leftovers import Before, free, in_use, taken_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_taken_http_port_stops_what_had_started(nats_server: NatsServer) -> None:
    grpc_port = free_port()
    with taken_port() as port:
        settings = AllocatorSettings(
            nats_url=nats_server.url, grpc_host="127.0.0.1", grpc_port=grpc_port, http_host="127.0.0.1", http_port=port
        )
        before = Before.now()
        with pytest.raises((OSError, ExceptionGroup)) as caught:
            await asyncio.wait_for(serve(settings, asyncio.Event()), 30)
        assert in_use(caught.value), caught.value
        await before.nothing_left()
    assert free(grpc_port)  # gRPC had started, and was closed


async def test_a_cancelled_allocator_stops_every_part(nats_server: NatsServer) -> None:
    settings = AllocatorSettings(
        nats_url=nats_server.url, grpc_host="127.0.0.1", grpc_port=free_port(), http_host="127.0.0.1", http_port=0
    )
    before = Before.now()
    task = asyncio.create_task(serve(settings, asyncio.Event()))
    running = RunningAllocator(settings, asyncio.Event(), task)
    stub = running.stub()
    await wait_for(lambda: answers(stub), what="allocator gRPC")
    assert (await stub.get_cluster(pb.GetClusterRequest())).nodes == []
    for channel in running.channels:
        channel.close()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await before.nothing_left()
    assert free(settings.grpc_port)


async def test_an_allocator_told_to_stop_while_its_ledger_is_loading_stops(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A view that never catches up (a stream without a leader, a consumer whose messages do not
    come) must not keep SIGTERM waiting: the allocator stops what had started and returns."""
    loading = asyncio.Event()

    async def never_ready(self: ClusterView) -> None:
        loading.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(ClusterView, "run", never_ready)
    settings = AllocatorSettings(
        nats_url=nats_server.url, grpc_host="127.0.0.1", grpc_port=free_port(), http_host="127.0.0.1", http_port=0
    )
    before = Before.now()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop))
    await asyncio.wait_for(loading.wait(), 20)
    stop.set()
    await asyncio.wait_for(task, 10)
    await before.nothing_left()
    assert free(settings.grpc_port)  # never started
