"""Allocator latency and throughput through NATS and gRPC, next to a raw nats-py echo.

One run, same machine. Each setup (by default one replica, and two) has its own embedded
nats-server, its allocator replicas as their own processes (NATS spreads requests over them
through the queue group), raw request/reply echo responders as their own processes (nats-py as
shipped, on asyncio; and the same on uvloop, the loop the services run on), and 16 nodes of 8
cards. For 1 and 16 concurrent clients it measures every setup's rows interleaved in rounds (in
each round each setup runs each row in turn), so that the machine's drift hits every row and
every setup alike:

- the raw echo (one request/reply: the floor of any NATS round trip);
- Allocate (a reservation: the node's ledger write and the owner's record, concurrently) and
  Release (one ledger write), each one request, timed separately, and the pair;
- Allocate with commit (a second, dependent write) followed by Release, through NATS: the
  operation whose throughput two replicas must keep (>= 0.8x one replica's, 16 clients);
- Allocate + Release through gRPC (to the first replica); and Allocate with commit + Release
  through gRPC with each request to any replica (as the queue group does) beside each client's
  owners routed to one replica;

and prints medians, p99, ratios against the echo and against one replica's throughput in the
same run, CAS attempts per ledger write (read from every replica's /metrics) and each process's
CPU time per operation.

    python -m benchmarks.allocator_bench [--seconds 4] [--rounds 8] [--clients 1,16]
        [--setup 1 --setup 2 --setup '2:GPULEDGER_CAS_ATTEMPTS=4' ...]

A setup is a replica count, optionally ':' and its replicas' flags or ``NAME=value`` environment
(``PYTHONPATH=<checkout>/libs:<checkout>/services`` runs another checkout's code beside this one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import re
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
from gpuledger_core.model import Node
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import NatsServer, embedded_nats, free_port
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.echo import ECHO

NODES = 16
ALLOCATE = "gpuledger.v1.allocator.allocate"
RELEASE = "gpuledger.v1.allocator.release"
TARGET_RATIO = 3.0
TARGET_CAS = 1.2
TARGET_SCALE = 0.8  # two replicas' allocate+commit+release ops/s over one replica's, 16 clients
ENV_TOKEN = re.compile(r"[A-Z_][A-Z0-9_]*=")
Op = Callable[[int, int], Awaitable[None]]


@dataclass
class Replica:
    process: asyncio.subprocess.Process
    grpc_port: int
    http_port: int


@dataclass
class Samples:
    """Latencies per row, and how long the op that fed them ran and how many it finished then."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    elapsed: dict[str, float] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)

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


async def drive(clients: int, seconds: float, op: Op) -> int:
    """Run ``op`` in ``clients`` loops for ``seconds``; how many ops ended within those seconds.
    Ops still running then are finished (their latencies count) but not counted as done in the
    window: the rate is the steady state's, not lowered by waiting for the slowest op to end."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    done = 0

    async def client(c: int) -> None:
        nonlocal done
        i = 0
        while loop.time() < end:
            await op(c, i)
            done += loop.time() <= end
            i += 1

    await asyncio.gather(*(client(c) for c in range(clients)))
    return done


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


def grpc_request(owner: str, commit: bool = False) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id=owner),
        containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1, gpu_mem_mib=1024))],
        commit=commit,
    )


ECHO_ROW = "raw nats-py echo"
UVLOOP_ECHO_ROW = "raw nats-py echo, uvloop"
ALLOCATE_ROW = "Allocate (NATS)"
RELEASE_ROW = "Release (NATS)"
PAIR_ROW = "Allocate + Release (NATS)"
COMMIT_ROW = "Allocate+commit, Release (NATS)"
GRPC_ROW = "Allocate + Release (gRPC)"
ANY_ROW = "Allocate+commit, Release (gRPC, each request to any replica)"
PINNED_ROW = "Allocate+commit, Release (gRPC, an owner's requests to one replica)"
WRITES_PER_OP = {PAIR_ROW: 2, COMMIT_ROW: 3, GRPC_ROW: 2, ANY_ROW: 3, PINNED_ROW: 3}  # reserve, (commit,) release
ROWS = (ECHO_ROW, UVLOOP_ECHO_ROW, ALLOCATE_ROW, RELEASE_ROW, PAIR_ROW, COMMIT_ROW, GRPC_ROW, ANY_ROW, PINNED_ROW)


@dataclass
class Setup:
    """One configuration under test: its own nats-server, replicas, echoes and client connection."""

    label: str
    nc: Client
    api: pb.AllocatorStub
    apis: list[pb.AllocatorStub]  # one per replica
    replicas: list[Replica]
    server: NatsServer
    echoes: list[asyncio.subprocess.Process]


@dataclass
class Measured:
    samples: Samples = field(default_factory=Samples)
    cpu: dict[str, float] = field(default_factory=dict)
    writes: int = 0
    busy_s: float = 0.0  # how long the rows whose CPU is counted ran


def ops_of(setup: Setup, clients: int, samples: Samples) -> list[tuple[str, Op]]:
    nc, api = setup.nc, setup.api
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

    def routed(row: str, pinned: bool) -> Op:
        """Each client's owners to one replica (``pinned``), or each request to any replica, as
        the NATS queue group sends them: what routing an owner's requests to one replica saves."""
        rng = random.Random(len(row))

        def pick(c: int) -> pb.AllocatorStub:
            return setup.apis[c % len(setup.apis)] if pinned else rng.choice(setup.apis)

        async def op(c: int, i: int) -> None:
            t0 = time.perf_counter()
            reply = await pick(c).allocate(grpc_request(f"r-{tag}-{next(serial)}", commit=True))
            await pick(c).release(pb.ReleaseRequest(allocation_id=reply.allocation.id))
            samples.add(row, time.perf_counter() - t0)

        return op

    return [
        (ECHO_ROW, echo),
        (UVLOOP_ECHO_ROW, echo_uvloop),
        (PAIR_ROW, nats_pair(PAIR_ROW, commit=False)),
        (COMMIT_ROW, nats_pair(COMMIT_ROW, commit=True)),
        (GRPC_ROW, via_grpc),
        (ANY_ROW, routed(ANY_ROW, pinned=False)),
        (PINNED_ROW, routed(PINNED_ROW, pinned=True)),
    ]


def pids_of(setup: Setup) -> dict[str, list[int]]:
    """The processes whose CPU is counted: the replicas, the server, and this one, which runs
    every client (the load generator shares the machine with what it measures)."""
    return {
        "allocator": [p.process.pid for p in setup.replicas],
        "nats-server": [server_pid(setup.server)],
        "load generator": [os.getpid()],
    }


async def measure(setups: list[Setup], clients: int, seconds: float, rounds: int) -> dict[str, tuple[Samples, str]]:
    """Every row of every setup, interleaved: in each round, each setup runs each row in turn."""
    measured = {setup.label: Measured() for setup in setups}
    ops = {setup.label: ops_of(setup, clients, measured[setup.label].samples) for setup in setups}
    before_cas = {setup.label: cas_counters(setup.replicas) for setup in setups}
    for _ in range(rounds):
        for setup in setups:
            m, pids = measured[setup.label], pids_of(setup)
            for row, op in ops[setup.label]:
                before = {name: sum(cpu_s(p) for p in ps) for name, ps in pids.items()}
                count = len(m.samples.latencies.get(row, []))
                started = time.monotonic()
                done = await drive(clients, seconds / rounds, op)
                ran = time.monotonic() - started
                m.samples.elapsed[row] = m.samples.elapsed.get(row, 0.0) + seconds / rounds
                m.samples.done[row] = m.samples.done.get(row, 0) + done
                m.writes += (len(m.samples.latencies.get(row, [])) - count) * WRITES_PER_OP.get(row, 0)
                if row in (PAIR_ROW, COMMIT_ROW):
                    m.busy_s += ran
                    for name, ps in pids.items():
                        m.cpu[name] = m.cpu.get(name, 0.0) + sum(cpu_s(p) for p in ps) - before[name]
    results = {}
    for setup in setups:
        m = measured[setup.label]
        (a0, c0), (a1, c1) = before_cas[setup.label], cas_counters(setup.replicas)
        ops_done = len(m.samples.latencies.get(PAIR_ROW, [])) + len(m.samples.latencies.get(COMMIT_ROW, []))
        note = (
            f"{setup.label}, {clients} client(s): {(a1 - a0) / max(1, m.writes):.3f} CAS attempts per"
            f" ledger change ({c1 - c0:.0f} conflicts in {m.writes} changes; one write may carry several);"
            " CPU per NATS allocate+release: "
            + ", ".join(f"{name} {cpu / max(1, ops_done) * 1e6:.0f} us" for name, cpu in m.cpu.items())
            + f"; {sum(m.cpu.values()) / max(m.busy_s, 1e-9):.2f} of the machine's {os.cpu_count()} cores busy"
        )
        results[setup.label] = (m.samples, note)
    return results


async def start_replica(nats_url: str, extra: list[str]) -> Replica:
    """A replica as its own process; ``extra``: its flags, and ``NAME=value`` for its environment
    (``GPULEDGER_*`` settings; ``PYTHONPATH`` to run another checkout's code beside this one)."""
    grpc_port, http_port = free_port(), free_port()
    env = {**os.environ, **dict(e.split("=", 1) for e in extra if ENV_TOKEN.match(e))}
    flags = [e for e in extra if not ENV_TOKEN.match(e)]
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
        *flags,
        env=env,
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


@dataclass(frozen=True)
class SetupSpec:
    """How many replicas, and the flags they get beyond the benchmark's (a variant under test)."""

    replicas: int
    extra: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        name = f"{self.replicas} replica{'s' if self.replicas > 1 else ''}"
        return f"{name} {' '.join(self.extra)}" if self.extra else name

    @classmethod
    def parse(cls, text: str) -> SetupSpec:
        count, _, extra = text.partition(":")
        if not count.strip().isdigit() or int(count) < 1:
            raise SystemExit(f"--setup {text!r}: must be a replica count, optionally ':' and the replicas' flags")
        return cls(int(count), tuple(extra.split()))


Result = tuple[str, int, Samples, str]  # setup label, clients, samples, note


async def start_setup(spec: SetupSpec, stack: contextlib.AsyncExitStack) -> Setup:
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: n{i}\n    profile: a100-sxm-8\n" for i in range(NODES)))
    server = await stack.enter_async_context(embedded_nats())
    replicas = [await start_replica(server.url, list(spec.extra)) for _ in range(spec.replicas)]
    echoes = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", ECHO, server.url, subject, loop)
        for subject, loop in (("bench.echo", "asyncio"), ("bench.echo.uvloop", "uvloop"))
    ]

    async def stop() -> None:
        for p in [r.process for r in replicas] + echoes:
            p.terminate()
            await p.wait()

    stack.push_async_callback(stop)
    nc = await bus.connect(server.url, "bench")
    stack.push_async_callback(nc.close)
    channels = [Channel("127.0.0.1", r.grpc_port) for r in replicas]
    for channel in channels:
        stack.callback(channel.close)
        await wait_nodes(pb.AllocatorStub(channel, timeout=30), nc, [n.node for n in fleet.nodes])
    for subject in ("bench.echo", "bench.echo.uvloop"):
        await wait_echo(nc, subject)
    apis = [pb.AllocatorStub(channel, timeout=30) for channel in channels]
    return Setup(spec.label, nc, apis[0], apis, replicas, server, echoes)


async def run(specs: list[SetupSpec], seconds: float, rounds: int, client_counts: list[int]) -> list[Result]:
    """Every setup at once (each its own server), measured interleaved, for 1 and 16 clients."""
    results: list[Result] = []
    async with contextlib.AsyncExitStack() as stack:
        setups = [await start_setup(spec, stack) for spec in specs]
        for clients in client_counts:
            for label, (samples, note) in (await measure(setups, clients, seconds, rounds)).items():
                results.append((label, clients, samples, note))
    return results


def rate(samples: Samples, row: str) -> float:
    feeding = PAIR_ROW if row in (ALLOCATE_ROW, RELEASE_ROW) else row
    return samples.done[feeding] / samples.elapsed[feeding]


def baseline(results: list[Result], clients: int) -> Samples | None:
    """The one-replica setup's samples for this client count (the first such setup), if any."""
    return next((s for label, c, s, _ in results if c == clients and label == SetupSpec(1).label), None)


def table(results: list[Result]) -> list[str]:
    lines = [
        "| setup | clients | path | ops/s | ops/s / one replica's | p50 ms | p99 ms | p50 / echo p50 |"
        " p50 / uvloop echo p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, clients, samples, _ in results:
        echo = statistics.median(samples.latencies[ECHO_ROW]) * 1000
        echo_uv = statistics.median(samples.latencies[UVLOOP_ECHO_ROW]) * 1000
        one = baseline(results, clients)
        for row in ROWS:
            values = samples.latencies[row]
            p50 = statistics.median(values) * 1000
            scale = f"{rate(samples, row) / rate(one, row):.2f}" if one is not None else "-"
            lines.append(
                f"| {label} | {clients} | {row} | {rate(samples, row):.0f} | {scale} | {p50:.2f} |"
                f" {pct(values, 0.99):.2f} | {p50 / echo:.2f} | {p50 / echo_uv:.2f} |"
            )
    return lines


def verdicts(results: list[Result]) -> list[str]:
    lines = []
    for label, clients, samples, _ in results:
        if clients == 1:
            echo = statistics.median(samples.latencies[ECHO_ROW])
            for row in (ALLOCATE_ROW, RELEASE_ROW):
                ratio = statistics.median(samples.latencies[row]) / echo
                verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
                lines.append(
                    f"{label}, 1 client: {row} median = {ratio:.3f}x the raw echo"
                    f" (target <= {TARGET_RATIO:g}x: {verdict})"
                )
        one = baseline(results, clients)
        if clients == 16 and one is not None and label != SetupSpec(1).label:
            scale = rate(samples, COMMIT_ROW) / rate(one, COMMIT_ROW)
            verdict = "met" if scale >= TARGET_SCALE else "NOT met"
            lines.append(
                f"{label}, 16 clients: {COMMIT_ROW} = {scale:.3f}x one replica's ops/s in this run"
                f" (target >= {TARGET_SCALE:g}x: {verdict})"
            )
    return lines


async def main(seconds: float, rounds: int, specs: list[SetupSpec], client_counts: list[int]) -> None:
    results = await run(specs, seconds, rounds, client_counts)
    print(
        f"allocator benchmark: {NODES} nodes x 8 cards; {seconds:g}s per row per client count and setup,"
        f" interleaved in {rounds} rounds over the setups: {', '.join(s.label for s in specs)}\n"
    )
    print("\n".join(table(results)))
    print()
    print("\n".join(note for *_, note in results))
    print("\n".join(verdicts(results)))
    for label, clients, _, note in results:
        if clients == 16 and not label.startswith("1 replica"):
            value = float(note.split(": ", 1)[1].split()[0])
            verdict = "met" if value <= TARGET_CAS else "NOT met"
            print(
                f"{label}: CAS attempts per ledger change, 16 clients over {NODES} nodes: {value:.3f}"
                f" (target <= {TARGET_CAS:g}: {verdict})"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--setup",
        action="append",
        help="a setup to measure: a replica count, optionally ':' and flags for its replicas"
        " (repeat; default: 1 and 2)",
    )
    parser.add_argument("--clients", default="1,16", help="comma list of concurrent client counts")
    args = parser.parse_args()
    specs = [SetupSpec.parse(s) for s in args.setup or ["1", "2"]]
    asyncio.run(main(args.seconds, args.rounds, specs, [int(n) for n in args.clients.split(",")]))
