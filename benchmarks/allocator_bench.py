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

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.fleet import parse_fleet
from gpuledger_common.natsserver import embedded_nats, free_port
from gpuledger_proto.gpuledger.allocator import v1 as pb

NODES = 16
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


async def drive(clients: int, seconds: float, op: Callable[[int, int], Awaitable[None]]) -> tuple[list[float], float]:
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
    return values.get("gpuledger_ledger_cas_attempts_total", 0.0), values.get("gpuledger_ledger_cas_conflicts_total", 0.0)


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


async def _ready(api: pb.AllocatorStub, nc: object) -> None:
    for _ in range(300):
        try:
            await api.get_cluster(pb.GetClusterRequest())
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise SystemExit("allocator did not start")


async def report(nc: object, api: pb.AllocatorStub, seconds: float, http_port: int) -> None:
    from nats.aio.client import Client

    assert isinstance(nc, Client)
    rows = []
    for clients in (1, 16):

        async def echo(c: int, i: int) -> None:
            await nc.request("bench.echo", b'{"x":1}', timeout=10)

        async def via_nats(c: int, i: int) -> None:
            body = {
                "owner": {"kind": "tool", "id": f"nats-{clients}-{c}-{i}"},
                "containers": [{"container": "", "request": {"count": 1, "mem_mib": 1024}}],
                "commit": True,
            }
            t0 = time.perf_counter()
            result = await bus.request(nc, "gpuledger.v1.allocator.allocate", body, timeout=30)
            single.append(time.perf_counter() - t0)
            await bus.request(nc, "gpuledger.v1.allocator.release", {"allocation_id": result["allocation"]["id"]}, timeout=30)

        async def via_grpc(c: int, i: int) -> None:
            reply = await api.allocate(
                pb.AllocateRequest(
                    owner=pb.Owner(kind="tool", id=f"grpc-{clients}-{c}-{i}"),
                    containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1, gpu_mem_mib=1024))],
                    commit=True,
                )
            )
            await api.release(pb.ReleaseRequest(allocation_id=reply.allocation.id))

        echo_lat, echo_t = await drive(clients, seconds, echo)
        single: list[float] = []
        a0, c0 = cas_counters(http_port)
        nats_lat, nats_t = await drive(clients, seconds, via_nats)
        a1, c1 = cas_counters(http_port)
        grpc_lat, grpc_t = await drive(clients, seconds, via_grpc)
        rounds = len(nats_lat)
        writes = 3 * rounds  # reserve, commit, release
        rows.append((clients, echo_lat, echo_t, nats_lat, nats_t, single, grpc_lat, grpc_t, (a1 - a0) / max(1, writes), c1 - c0))

    print(f"allocator benchmark: {NODES} nodes x 8 cards, {seconds:g}s per measurement, one allocator process\n")
    print("| clients | path | ops/s | p50 ms | p99 ms | p50 / echo p50 |")
    print("|---|---|---|---|---|---|")
    for clients, echo_lat, echo_t, nats_lat, nats_t, single, grpc_lat, grpc_t, cas, conflicts in rows:
        e50 = statistics.median(echo_lat) * 1000
        print(f"| {clients} | raw nats echo | {len(echo_lat) / echo_t:.0f} | {e50:.2f} | {pct(echo_lat, 0.99):.2f} | 1.00 |")
        print(f"| {clients} | allocate (one NATS request) | - | {statistics.median(single) * 1000:.2f} | {pct(single, 0.99):.2f} | {statistics.median(single) * 1000 / e50:.2f} |")
        print(f"| {clients} | allocate+release via NATS | {len(nats_lat) / nats_t:.0f} | {statistics.median(nats_lat) * 1000:.2f} | {pct(nats_lat, 0.99):.2f} | {statistics.median(nats_lat) * 1000 / e50:.2f} |")
        print(f"| {clients} | allocate+release via gRPC | {len(grpc_lat) / grpc_t:.0f} | {statistics.median(grpc_lat) * 1000:.2f} | {pct(grpc_lat, 0.99):.2f} | {statistics.median(grpc_lat) * 1000 / e50:.2f} |")
    for clients, *_, cas, conflicts in rows:
        print(f"\n{clients} client(s): CAS attempts per ledger write {cas:.3f} ({conflicts:.0f} conflicts)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    asyncio.run(main(parser.parse_args().seconds))
