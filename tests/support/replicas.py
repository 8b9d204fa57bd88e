"""Run allocator replicas and placement services in-process against a real nats-server, for tests
and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from grpclib.client import Channel

from gpuledger_allocator.app import serve
from gpuledger_allocator.settings import AllocatorSettings
from gpuledger_dev.natsserver import free_port
from gpuledger_placement.app import serve as place_serve
from gpuledger_placement.settings import PlacementSettings
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.waiting import wait_for as wait_for  # the tests' one way to wait, re-exported here

STOP_S = 15.0  # how long a service in this process may take to stop


async def stopped(task: asyncio.Task[None], what: str) -> None:
    """Wait for a service's task to end; if it does not within ``STOP_S``, fail naming where every
    task of the process was waiting (a shutdown that hangs is a defect to find, not to wait out)."""
    done, _ = await asyncio.wait({task}, timeout=STOP_S)
    if task in done:
        return task.result()
    others = [t for t in asyncio.all_tasks() if not t.done() and t is not asyncio.current_task()]
    waiting = "\n".join(where_it_waits(t) for t in others)
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise TimeoutError(f"{what} did not stop within {STOP_S:g}s; the tasks were waiting at:\n{waiting}")


def where_it_waits(task: asyncio.Task[Any]) -> str:
    """The task's chain of awaits, outermost first, down to what it waits on."""
    steps: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(steps) < 40:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            steps.append(type(awaited).__name__)
            break
        steps.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return f"  {task.get_name()}: {' -> '.join(steps)}"


async def answers(stub: pb.AllocatorStub) -> bool:
    """Whether the allocator answers GetCluster (an empty cluster is an answer too)."""
    await stub.get_cluster(pb.GetClusterRequest())
    return True


@dataclass
class RunningAllocator:
    settings: AllocatorSettings
    stop: asyncio.Event
    task: asyncio.Task[None]
    channels: list[Channel] = field(default_factory=list)
    client_tls: ssl.SSLContext | None = None  # the tests' own certificate, with mutual TLS on

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.settings.grpc_port}"

    def http_port(self) -> int:
        """The port of /healthz, /metrics and the dashboard (the settings may ask for any)."""
        return self.settings.http_port

    def stub(self, tls: ssl.SSLContext | None = None) -> pb.AllocatorStub:
        channel = Channel("127.0.0.1", self.settings.grpc_port, ssl=tls or self.client_tls)
        self.channels.append(channel)
        return pb.AllocatorStub(channel, timeout=10.0)

    async def close(self) -> None:
        for channel in self.channels:
            channel.close()
        self.stop.set()
        await stopped(self.task, "the allocator")


@contextlib.asynccontextmanager
async def running_allocator(nats_url: str, **overrides: Any) -> AsyncIterator[RunningAllocator]:
    """An allocator in this process, ready once it answers gRPC. ``overrides``: settings, and
    ``client_tls`` (an ``ssl.SSLContext``), the tests' certificate when mutual TLS is on."""
    client_tls: ssl.SSLContext | None = overrides.pop("client_tls", None)
    values: dict[str, Any] = {
        "nats_url": nats_url,
        "grpc_host": "127.0.0.1",
        "grpc_port": free_port(),
        "http_host": "127.0.0.1",
        "http_port": free_port(),
        "stale_after_s": 3600.0,
        "sweep_interval_s": 0.2,
        "placement_retry_s": 0.0,  # tests start and stop placement at will
    }
    values.update(overrides)
    settings = AllocatorSettings(**values)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop))
    running = RunningAllocator(settings, stop, task, client_tls=client_tls)
    try:
        stub = running.stub()
        await wait_for(lambda: answers(stub), what="allocator gRPC")
        yield running
    finally:
        await running.close()


@dataclass
class RunningPlacement:
    settings: PlacementSettings
    stop: asyncio.Event
    task: asyncio.Task[None]

    @property
    def url(self) -> str:
        """The extender's base URL (the scheduler's urlPrefix): HTTPS on its own port with TLS on."""
        if self.settings.extender_tls:
            return f"https://127.0.0.1:{self.settings.extender_port}{self.settings.url_prefix}"
        return f"http://127.0.0.1:{self.settings.http_port}{self.settings.url_prefix}"

    @property
    def ops_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.http_port}"

    async def close(self) -> None:
        self.stop.set()
        await stopped(self.task, "placement")


@contextlib.asynccontextmanager
async def running_placement(nats_url: str, **overrides: Any) -> AsyncIterator[RunningPlacement]:
    """A placement service in this process; ready once its view of the ledger is loaded."""
    values: dict[str, Any] = {
        "nats_url": nats_url,
        "http_host": "127.0.0.1",
        "http_port": free_port(),
        "extender_port": free_port(),
        "kube": "off",
        "stale_after_s": 0.0,
    }
    values.update(overrides)
    settings = PlacementSettings(**values)
    stop = asyncio.Event()
    task = asyncio.create_task(place_serve(settings, stop))
    running = RunningPlacement(settings, stop, task)
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                if task.done():
                    task.result()  # the service failed to start: say why
                async with session.get(f"{running.ops_url}/readyz") as reply:
                    return reply.status == 200

            await wait_for(ready, what="placement ready")
        yield running
    finally:
        await running.close()
