"""Allocator throughput and latency through NATS and gRPC, next to a raw nats-py echo.

One run, same machine: an embedded nats-server, allocator replicas as their own processes
(NATS spreads requests over them through the queue group), a raw request/reply echo as its own
process, and 16 nodes of 8 cards. For 1 and 16 concurrent clients it measures:

- the raw echo (one request/reply, the floor of any NATS round trip);
- one Allocate that only reserves (one round of writes: the reservation and the owner claim,
  concurrently);
- Allocate with commit (a second, dependent write) followed by Release (a third write), through
  NATS and through gRPC;

and prints medians, p99 and ratios against the echo, plus CAS attempts per ledger write read
from every replica's /metrics.

    python benchmarks/allocator_bench.py [--seconds 5] [--replicas 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from grpclib.client import Channel
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.fleet import parse_fleet
from gpuledger_common.natsserver import embedded_nats, free_port
from gpuledger_core.model import Node
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
Op = Callable[[int, int], Awaitable[None]]


@dataclass
class Replica:
    process: asyncio.subprocess.Process
    grpc_port: int
    http_port: int


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def drive(clients: int, seconds: float, op: Op) -> tuple[list[float], float]:
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


def cas_counters(replicas: list[Replica]) -> tuple[float, float]:
    attempts = conflicts = 0.0
    for replica in replicas:
        url = f"http://127.0.0.1:{replica.http_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("gpuledger_ledger_cas_attempts_total "):
                attempts += float(line.split()[1])
            elif line.startswith("gpuledger_ledger_cas_conflicts_total "):
                conflicts += float(line.split()[1])
    return attempts, conflicts


def alloc_body(owner: str, commit: bool) -> dict[str, object]:
    return {
        "owner": {"kind": "tool", "id": owner},
        "containers": [{"container": "", "request": {"count": 1, "mem_mib": 1024}}],
        "commit": commit,
    }


def grpc_request(owner: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id=owner),
        containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1, gpu_mem_mib=1024))],
        commit=True,
    )


def row(clients: int, path: str, latencies: list[float], elapsed: float, echo_p50: float) -> str:
    p50 = statistics.median(latencies) * 1000
    rate = len(latencies) / elapsed
    return f"| {clients} | {path} | {rate:.0f} | {p50:.2f} | {pct(latencies, 0.99):.2f} | {p50 / echo_p50:.2f} |"


async def measure(
    nc: Client, api: pb.AllocatorStub, clients: int, seconds: float, replicas: list[Replica]
) -> list[str]:
    reserve_lat: list[float] = []

    async def echo(c: int, i: int) -> None:
        await nc.request("bench.echo", b'{"x":1}', timeout=10)

    async def reserve_only(c: int, i: int) -> None:  # timed alone; the release is not
        t0 = time.perf_counter()
        result = await bus.request(nc, ALLOCATE, alloc_body(f"r-{clients}-{c}-{i}", False), timeout=30)
        reserve_lat.append(time.perf_counter() - t0)
        await bus.request(nc, RELEASE, {"allocation_id": result["allocation"]["id"]}, timeout=30)

    async def via_nats(c: int, i: int) -> None:
        result = await bus.request(nc, ALLOCATE, alloc_body(f"n-{clients}-{c}-{i}", True), timeout=30)
        await bus.request(nc, RELEASE, {"allocation_id": result["allocation"]["id"]}, timeout=30)

    async def via_grpc(c: int, i: int) -> None:
        reply = await api.allocate(grpc_request(f"g-{clients}-{c}-{i}"))
        await api.release(pb.ReleaseRequest(allocation_id=reply.allocation.id))

    echo_lat, echo_t = await drive(clients, seconds, echo)
    _, reserve_t = await drive(clients, seconds, reserve_only)
    a0, c0 = cas_counters(replicas)
    nats_lat, nats_t = await drive(clients, seconds, via_nats)
    a1, c1 = cas_counters(replicas)
    grpc_lat, grpc_t = await drive(clients, seconds, via_grpc)
    e50 = statistics.median(echo_lat) * 1000
    writes = 3 * len(nats_lat)  # reserve (with the owner claim beside it), commit, release
    return [
        row(clients, "raw nats echo", echo_lat, echo_t, e50),
        row(clients, "allocate, reserve only (NATS)", reserve_lat, reserve_t, e50),
        row(clients, "allocate+commit, release (NATS)", nats_lat, nats_t, e50),
        row(clients, "allocate+commit, release (gRPC)", grpc_lat, grpc_t, e50),
        f"# {clients} client(s): {(a1 - a0) / max(1, writes):.3f} CAS attempts per ledger write "
        f"({c1 - c0:.0f} conflicts in {writes} writes)",
    ]


async def start_replica(nats_url: str) -> Replica:
    grpc_port, http_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuledger_allocator",
        "--nats-url",
        nats_url,
        "--grpc-host",
        "127.0.0.1",
        "--grpc-port",
        str(grpc_port),
        "--http-host",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--log-level",
        "warning",
        "--stale-after-s",
        "3600",
    )
    return Replica(process, grpc_port, http_port)


async def wait_nodes(api: pb.AllocatorStub, nc: Client, nodes: list[Node]) -> None:
    """Announce the fleet until the replica has every node (it may not be listening yet)."""
    for _ in range(300):
        await announce(nc, nodes)
        try:
            if len((await api.get_cluster(pb.GetClusterRequest())).nodes) >= NODES:
                return
        except Exception:  # not up yet
            pass
        await asyncio.sleep(0.2)
    raise SystemExit("the allocator did not start or did not learn the fleet")


async def main(seconds: float, replica_count: int) -> None:
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: n{i}\n    profile: a100-sxm-8\n" for i in range(NODES)))
    async with embedded_nats() as server:
        replicas = [await start_replica(server.url) for _ in range(replica_count)]
        echo = await asyncio.create_subprocess_exec(sys.executable, "-c", ECHO, server.url)
        nc = await bus.connect(server.url, "bench")
        channels = [Channel("127.0.0.1", r.grpc_port) for r in replicas]
        try:
            for channel in channels:
                await wait_nodes(pb.AllocatorStub(channel, timeout=30), nc, [n.node for n in fleet.nodes])
            api = pb.AllocatorStub(channels[0], timeout=30)
            lines = [line for clients in (1, 16) for line in await measure(nc, api, clients, seconds, replicas)]
        finally:
            for channel in channels:
                channel.close()
            await nc.close()
            for p in [r.process for r in replicas] + [echo]:
                p.terminate()
                await p.wait()
    print(f"allocator benchmark: {NODES} nodes x 8 cards, {replica_count} allocator replica(s), {seconds:g}s each\n")
    print("| clients | path | ops/s | p50 ms | p99 ms | p50 / echo p50 |")
    print("|---|---|---|---|---|---|")
    print("\n".join(line for line in lines if line.startswith("|")))
    print("\n".join(line.removeprefix("# ") for line in lines if line.startswith("#")))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.replicas))
