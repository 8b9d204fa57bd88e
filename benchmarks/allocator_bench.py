"""Allocator latency and throughput through NATS and gRPC, next to a raw nats-py echo.

One run, same machine: an embedded nats-server, allocator replicas as their own processes
(NATS spreads requests over them through the queue group), raw request/reply echo responders as
their own processes (nats-py as shipped, on asyncio; and the same on uvloop, the loop the
services run on), and 16 nodes of 8 cards. For each replica count and for 1 and 16 concurrent
clients it measures, interleaved in rounds so that the machine's drift hits every row alike:

- the raw echo (one request/reply: the floor of any NATS round trip);
- Allocate (a reservation: the node's ledger write and the owner's record, concurrently) and
  Release (one ledger write), each one request, timed separately, and the pair;
- Allocate with commit (a second, dependent write) followed by Release, through NATS;
- the same through gRPC;

and prints medians, p99, ratios against the echo, CAS attempts per ledger write (read from
every replica's /metrics) and each process's CPU time per operation.

    python benchmarks/allocator_bench.py [--seconds 4] [--rounds 8] [--replicas 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from grpclib.client import Channel
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.fleet import parse_fleet
from gpuledger_common.natsserver import NatsServer, embedded_nats, free_port
from gpuledger_core.model import Node
from gpuledger_proto.gpuledger.allocator import v1 as pb
from gpuledger_testing.echo import ECHO

NODES = 16
ALLOCATE = "gpuledger.v1.allocator.allocate"
RELEASE = "gpuledger.v1.allocator.release"
TARGET_RATIO = 3.0
TARGET_CAS = 1.2
Op = Callable[[int, int], Awaitable[None]]


@dataclass
class Replica:
    process: asyncio.subprocess.Process
    grpc_port: int
    http_port: int


@dataclass
class Samples:
    """Latencies per row, and how long the op that fed them ran."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    elapsed: dict[str, float] = field(default_factory=dict)

    def add(self, row: str, seconds: float) -> None:
        self.latencies.setdefault(row, []).append(seconds)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def server_pid(server: NatsServer) -> int:
    if server.process is None:
        raise SystemExit("the embedded nats-server is not running")
    return server.process.pid


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(clients: int, seconds: float, op: Op) -> float:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    started = time.perf_counter()

    async def client(c: int) -> None:
        i = 0
        while loop.time() < end:
            await op(c, i)
            i += 1

    await asyncio.gather(*(client(c) for c in range(clients)))
    return time.perf_counter() - started


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
        commit=False,
    )


ECHO_ROW = "raw nats-py echo"
UVLOOP_ECHO_ROW = "raw nats-py echo, uvloop"
ALLOCATE_ROW = "Allocate (NATS)"
RELEASE_ROW = "Release (NATS)"
PAIR_ROW = "Allocate + Release (NATS)"
COMMIT_ROW = "Allocate+commit, Release (NATS)"
GRPC_ROW = "Allocate + Release (gRPC)"
WRITES_PER_OP = {PAIR_ROW: 2, COMMIT_ROW: 3, GRPC_ROW: 2}  # reserve, (commit,) release
ROWS = (ECHO_ROW, UVLOOP_ECHO_ROW, ALLOCATE_ROW, RELEASE_ROW, PAIR_ROW, COMMIT_ROW, GRPC_ROW)


@dataclass
class Setup:
    nc: Client
    api: pb.AllocatorStub
    replicas: list[Replica]
    server: NatsServer
    echoes: list[asyncio.subprocess.Process]


async def measure(setup: Setup, clients: int, seconds: float, rounds: int) -> tuple[Samples, list[str]]:
    nc, api, samples = setup.nc, setup.api, Samples()
    tag = f"{len(setup.replicas)}-{clients}"
    serial = itertools.count()  # every request a new owner: none is answered as a retry

    async def echo(c: int, i: int) -> None:
        t0 = time.perf_counter()
        await nc.request("bench.echo", b'{"x":1}', timeout=10)
        samples.add(ECHO_ROW, time.perf_counter() - t0)

    async def echo_uvloop(c: int, i: int) -> None:
        t0 = time.perf_counter()
        await nc.request("bench.echo.uvloop", b'{"x":1}', timeout=10)
        samples.add(UVLOOP_ECHO_ROW, time.perf_counter() - t0)

    def nats_pair(row: str, commit: bool) -> Op:
        async def op(c: int, i: int) -> None:
            t0 = time.perf_counter()
            result = await bus.request(nc, ALLOCATE, alloc_body(f"n-{tag}-{next(serial)}", commit), timeout=30)
            t1 = time.perf_counter()
            await bus.request(nc, RELEASE, {"allocation_id": result["allocation"]["id"]}, timeout=30)
            t2 = time.perf_counter()
            if not commit:
                samples.add(ALLOCATE_ROW, t1 - t0)
                samples.add(RELEASE_ROW, t2 - t1)
            samples.add(row, t2 - t0)

        return op

    async def via_grpc(c: int, i: int) -> None:
        t0 = time.perf_counter()
        reply = await api.allocate(grpc_request(f"g-{tag}-{next(serial)}"))
        await api.release(pb.ReleaseRequest(allocation_id=reply.allocation.id))
        samples.add(GRPC_ROW, time.perf_counter() - t0)

    ops: list[tuple[str, Op]] = [
        (ECHO_ROW, echo),
        (UVLOOP_ECHO_ROW, echo_uvloop),
        (PAIR_ROW, nats_pair(PAIR_ROW, commit=False)),
        (COMMIT_ROW, nats_pair(COMMIT_ROW, commit=True)),
        (GRPC_ROW, via_grpc),
    ]
    pids = {"allocator": [p.process.pid for p in setup.replicas], "nats-server": [server_pid(setup.server)]}
    cpu = dict.fromkeys(pids, 0.0)
    a0, c0 = cas_counters(setup.replicas)
    writes = 0
    for _ in range(rounds):
        for row, op in ops:
            before = {name: sum(cpu_s(p) for p in ps) for name, ps in pids.items()}
            count = len(samples.latencies.get(row, []))
            samples.elapsed[row] = samples.elapsed.get(row, 0.0) + await drive(clients, seconds / rounds, op)
            done = len(samples.latencies.get(row, [])) - count
            writes += done * WRITES_PER_OP.get(row, 0)
            if row in (PAIR_ROW, COMMIT_ROW):
                for name, ps in pids.items():
                    cpu[name] += sum(cpu_s(p) for p in ps) - before[name]
    a1, c1 = cas_counters(setup.replicas)
    ops_done = len(samples.latencies.get(PAIR_ROW, [])) + len(samples.latencies.get(COMMIT_ROW, []))
    notes = [
        f"{len(setup.replicas)} replica(s), {clients} client(s): {(a1 - a0) / max(1, writes):.3f} CAS attempts per"
        f" ledger write ({c1 - c0:.0f} conflicts in {writes} writes); CPU per NATS allocate+release: "
        + ", ".join(f"{name} {cpu[name] / max(1, ops_done) * 1e6:.0f} us" for name in pids)
    ]
    return samples, notes


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
        "--kube",
        "off",
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


async def wait_echo(nc: Client, subject: str) -> None:
    for _ in range(300):
        try:
            await nc.request(subject, b"{}", timeout=1)
            return
        except Exception:  # not subscribed yet
            await asyncio.sleep(0.1)
    raise SystemExit(f"the echo on {subject} did not start")


async def run(replica_count: int, seconds: float, rounds: int) -> list[tuple[int, int, Samples, list[str]]]:
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: n{i}\n    profile: a100-sxm-8\n" for i in range(NODES)))
    results = []
    async with embedded_nats() as server:
        replicas = [await start_replica(server.url) for _ in range(replica_count)]
        echoes = [
            await asyncio.create_subprocess_exec(sys.executable, "-c", ECHO, server.url, subject, loop)
            for subject, loop in (("bench.echo", "asyncio"), ("bench.echo.uvloop", "uvloop"))
        ]
        nc = await bus.connect(server.url, "bench")
        channels = [Channel("127.0.0.1", r.grpc_port) for r in replicas]
        try:
            for channel in channels:
                await wait_nodes(pb.AllocatorStub(channel, timeout=30), nc, [n.node for n in fleet.nodes])
            for subject in ("bench.echo", "bench.echo.uvloop"):
                await wait_echo(nc, subject)
            setup = Setup(nc, pb.AllocatorStub(channels[0], timeout=30), replicas, server, echoes)
            for clients in (1, 16):
                samples, notes = await measure(setup, clients, seconds, rounds)
                results.append((replica_count, clients, samples, notes))
        finally:
            for channel in channels:
                channel.close()
            await nc.close()
            for p in [r.process for r in replicas] + echoes:
                p.terminate()
                await p.wait()
    return results


def table(results: list[tuple[int, int, Samples, list[str]]]) -> list[str]:
    lines = [
        "| replicas | clients | path | ops/s | p50 ms | p99 ms | p50 / echo p50 | p50 / uvloop echo p50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for replicas, clients, samples, _ in results:
        echo = statistics.median(samples.latencies[ECHO_ROW]) * 1000
        echo_uv = statistics.median(samples.latencies[UVLOOP_ECHO_ROW]) * 1000
        for row in ROWS:
            values = samples.latencies[row]
            p50 = statistics.median(values) * 1000
            feeding = PAIR_ROW if row in (ALLOCATE_ROW, RELEASE_ROW) else row
            rate = len(values) / samples.elapsed[feeding]
            lines.append(
                f"| {replicas} | {clients} | {row} | {rate:.0f} | {p50:.2f} | {pct(values, 0.99):.2f} |"
                f" {p50 / echo:.2f} | {p50 / echo_uv:.2f} |"
            )
    return lines


def verdicts(results: list[tuple[int, int, Samples, list[str]]]) -> list[str]:
    lines = []
    for replicas, clients, samples, _ in results:
        if clients != 1:
            continue
        echo = statistics.median(samples.latencies[ECHO_ROW])
        for row in (ALLOCATE_ROW, RELEASE_ROW):
            ratio = statistics.median(samples.latencies[row]) / echo
            verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
            lines.append(
                f"{replicas} replica(s), 1 client: {row} median = {ratio:.2f}x the raw echo"
                f" (target <= {TARGET_RATIO:g}x: {verdict})"
            )
    return lines


async def main(seconds: float, rounds: int, replica_counts: list[int]) -> None:
    results = [result for count in replica_counts for result in await run(count, seconds, rounds)]
    print(
        f"allocator benchmark: {NODES} nodes x 8 cards; {seconds:g}s per row per client count,"
        f" interleaved in {rounds} rounds\n"
    )
    print("\n".join(table(results)))
    print()
    print("\n".join(note for *_, notes in results for note in notes))
    print("\n".join(verdicts(results)))
    cas = [n for r, c, _, notes in results if r > 1 and c == 16 for n in notes]
    if cas:
        value = float(cas[0].split(": ", 1)[1].split()[0])
        verdict = "met" if value <= TARGET_CAS else "NOT met"
        print(
            f"CAS attempts per ledger write, 16 clients over {NODES} nodes, several replicas: {value:.3f}"
            f" (target <= {TARGET_CAS:g}: {verdict})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--replicas", default="1,2", help="comma list of replica counts to measure")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.rounds, [int(n) for n in args.replicas.split(",")]))
