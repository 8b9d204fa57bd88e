"""Allocator throughput and latency through NATS and gRPC, next to a raw nats-py echo.

One run, same machine: an embedded nats-server, the allocator as its own process, a raw
request/reply echo as its own process, and 16 nodes of 8 cards. For 1 and 16 concurrent
clients it measures allocate(+commit) and release round trips, and prints medians, p99 and
ratios against the echo. It also reads the allocator's CAS counters from /metrics.

    python benchmarks/allocator_bench.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable

from grpclib.client import Channel
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.fleet import parse_fleet
from gpuledger_common.natsserver import embedded_nats, free_port
from gpuledger_proto.gpuledger.allocator import v1 as pb

NODES = 16
ALLOCATE = "gpuledger.v1.allocator.allocate"
RELEASE = "gpuledger.v1.allocator.release"
ECHO = """
import asyncio, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe("bench.echo", cb=echo)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def drive(
    clients: int, seconds: float, op: Callable[[int, int], Awaitable[None]]
) -> tuple[list[float], float]:
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def client(c: int) -> None:
        i = 0
        while loop.time() < end:
            t0 = time.perf_counter()
            await op(c, i)
            latencies.append(time.perf_counter() - t0)
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return latencies, time.perf_counter() - t0


def cas_counters(http_port: int) -> tuple[float, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("gpuledger_ledger_cas_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    attempts = values.get("gpuledger_ledger_cas_attempts_total", 0.0)
    return attempts, values.get("gpuledger_ledger_cas_conflicts_total", 0.0)


async def main(seconds: float) -> None:
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: n{i}\n    profile: a100-sxm-8\n" for i in range(NODES)))
    async with embedded_nats() as server:
        grpc_port, http_port = free_port(), free_port()
        allocator = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuledger_allocator", "--nats-url", server.url, "--grpc-host", "127.0.0.1",
            "--grpc-port", str(grpc_port), "--http-host", "127.0.0.1", "--http-port", str(http_port),
            "--log-level", "warning", "--stale-after-s", "3600",
        )
        echo = await asyncio.create_subprocess_exec(sys.executable, "-c", ECHO, server.url)
        nc = await bus.connect(server.url, "bench")
        channel = Channel("127.0.0.1", grpc_port)
        api = pb.AllocatorStub(channel, timeout=30)
        try:
            await _ready(api, nc)
            await announce(nc, [n.node for n in fleet.nodes])
            while len((await api.get_cluster(pb.GetClusterRequest())).nodes) < NODES:
                await asyncio.sleep(0.1)
            await report(nc, api, seconds, http_port)
        finally:
            channel.close()
            await nc.close()
            for p in (allocator, echo):
                p.terminate()
                await p.wait()


async def _ready(api: pb.AllocatorStub, nc: Client) -> None:
    for _ in range(300):
        try:
            await api.get_cluster(pb.GetClusterRequest())
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise SystemExit("allocator did not start")


def alloc_body(owner: str) -> dict[str, object]:
    return {
        "owner": {"kind": "tool", "id": owner},
        "containers": [{"container": "", "request": {"count": 1, "mem_mib": 1024}}],
        "commit": True,
    }


def grpc_request(owner: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id=owner),
        containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1, gpu_mem_mib=1024))],
        commit=True,
    )


def row(clients: int, path: str, latencies: list[float], elapsed: float | None, echo_p50: float) -> str:
    p50 = statistics.median(latencies) * 1000
    rate = f"{len(latencies) / elapsed:.0f}" if elapsed else "-"
    return f"| {clients} | {path} | {rate} | {p50:.2f} | {pct(latencies, 0.99):.2f} | {p50 / echo_p50:.2f} |"


async def measure(nc: Client, api: pb.AllocatorStub, clients: int, seconds: float, http_port: int) -> list[str]:
    single: list[float] = []

    async def echo(c: int, i: int) -> None:
        await nc.request("bench.echo", b'{"x":1}', timeout=10)

    async def via_nats(c: int, i: int) -> None:
        t0 = time.perf_counter()
        result = await bus.request(nc, ALLOCATE, alloc_body(f"nats-{clients}-{c}-{i}"), timeout=30)
        single.append(time.perf_counter() - t0)
        await bus.request(nc, RELEASE, {"allocation_id": result["allocation"]["id"]}, timeout=30)

    async def via_grpc(c: int, i: int) -> None:
        reply = await api.allocate(grpc_request(f"grpc-{clients}-{c}-{i}"))
        await api.release(pb.ReleaseRequest(allocation_id=reply.allocation.id))

    echo_lat, echo_t = await drive(clients, seconds, echo)
    a0, c0 = cas_counters(http_port)
    nats_lat, nats_t = await drive(clients, seconds, via_nats)
    a1, c1 = cas_counters(http_port)
    grpc_lat, grpc_t = await drive(clients, seconds, via_grpc)
    e50 = statistics.median(echo_lat) * 1000
    writes = 3 * len(nats_lat)  # reserve, commit, release
    return [
        row(clients, "raw nats echo", echo_lat, echo_t, e50),
        row(clients, "allocate (one NATS request)", single, None, e50),
        row(clients, "allocate+release via NATS", nats_lat, nats_t, e50),
        row(clients, "allocate+release via gRPC", grpc_lat, grpc_t, e50),
        f"<!-- {clients} client(s): CAS attempts per ledger write {(a1 - a0) / max(1, writes):.3f}, "
        f"{c1 - c0:.0f} conflicts -->",
    ]


async def report(nc: Client, api: pb.AllocatorStub, seconds: float, http_port: int) -> None:
    lines = [line for clients in (1, 16) for line in await measure(nc, api, clients, seconds, http_port)]
    print(f"allocator benchmark: {NODES} nodes x 8 cards, {seconds:g}s per measurement, one allocator process\n")
    print("| clients | path | ops/s | p50 ms | p99 ms | p50 / echo p50 |")
    print("|---|---|---|---|---|---|")
    print("\n".join(line for line in lines if line.startswith("|")))
    print("\n".join(line.removeprefix("<!-- ").removesuffix(" -->") for line in lines if line.startswith("<!--")))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    asyncio.run(main(parser.parse_args().seconds))
