"""The ledger at scale: thousands of simulated nodes against real allocator and placement processes.

One run, same machine, for each fleet size (default 500, then 5,000 nodes of 8 H100): an embedded
nats-server with JetStream; a load generator that publishes every node's inventory (from this
process) and a heartbeat every 5 s (from a process of its own, as the nodes are other machines: a
thousand heartbeats a second in this process would delay the requests it times) on the subjects
the inventory service uses (``gpuledger.v1.inventory.<node>``, ``gpuledger.v1.heartbeat.<node>``,
the bodies of ``gpuledger_common.announce``), not one process per node; allocator and placement
replicas as their own processes; and a raw nats-py echo (asyncio) as the floor of any NATS round
trip. This process freezes its heap as the services do (``gpuledger_common.gcpause``): the fleet
it holds would otherwise make each of its full collections a pause in the figures. It measures:

- the ledger filling from the inventories (until the allocator counts every card);
- cold start of a second allocator replica and of three placement replicas: process start until
  its ops port answers, which each service opens only once its full view of the ledger is loaded;
- compare-and-set (``LedgerStore.mutate``: read, transition, write) p50/p99 at 200 writes/s,
  open loop, from this process, while the three placement replicas watch the bucket;
- watch fan-out: a probe node taken whole and freed by a write while that load runs; the time
  until each placement replica's prioritize sees the change;
- Allocate over NATS (placement's choice, then the reservation and the owner record) p50/p99 at
  50/s, open loop, for ``--seconds``, with placement's policy rebuilt every 5 s; then the same while
  ``/metrics`` is scraped every 5 s (a Prometheus scrapes every 15-60 s); while ``gpuledger inspect``
  lists the whole cluster over and over; then the echo at 50/s;
- a burst of 200 one-card Allocates sent at once: how many were refused;
- ``/metrics`` and GetCluster: time and size, each alone;
- RSS of every replica at the end;
- Allocate at 50/s again with one allocator replica (as the issue measured it): with placement's
  answers asked ahead (the default), then with a replica that asks placement during each request
  (``--placement-ahead-s 0``), and where each request's nodes came from; the echo again.

    python -m benchmarks.ledger_scale [--nodes 500,5000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from nats.aio.client import Client

from gpuledger_common import bus, gcpause
from gpuledger_common.announce import announce
from gpuledger_common.store import LedgerStore
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, release, reserve
from gpuledger_core.model import Allocation, AllocState, Node, Owner, OwnerKind, Request
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import embedded_nats, free_port
from tests.support.echo import ECHO

ALLOCATE = "gpuledger.v1.allocator.allocate"
ECHO_SUBJECT = "bench.echo"
PLACEMENTS = 3
CAS_RATE = 200.0
ALLOCATE_RATE = 50.0
BURST = 200
HEARTBEAT_S = 5.0
BEAT_TICK_S = 0.002  # the heartbeat process sends what is due this often (a few at a time at 5,000 nodes)
SCRAPE_S = 5.0
TARGETS = {"cold start s": 2.0, "CAS p99 ms": 5.0, "RSS MiB": 500.0, "Allocate p99 ms": 5.0}


@dataclass
class Proc:
    name: str
    process: asyncio.subprocess.Process
    http_port: int
    grpc_port: int = 0
    ready_s: float = 0.0


@dataclass
class Figures:
    nodes: int
    rows: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, row: str, value: str) -> None:
        self.rows[row] = value
        print(f"  {self.nodes} nodes | {row}: {value}", flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def p50_p99(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1000:.2f} ms, p99 {pct(values, 0.99):.2f} ms (n={len(values)})"


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def fleet_of(count: int) -> list[Node]:
    text = "nodes:\n" + "".join(f"  - name: sim-{i:05d}\n    profile: h100-sxm-8\n" for i in range(count))
    return [n.node for n in parse_fleet(text).nodes]


async def heartbeats(nc: Client, nodes: list[Node]) -> None:
    """Every node's heartbeat every ``HEARTBEAT_S``, each node at its own moment of the interval,
    as independent machines send them: a few every ``BEAT_TICK_S``, never hundreds at once."""
    order = list(nodes)
    random.Random(7).shuffle(order)  # each node's phase within the interval
    loop = asyncio.get_running_loop()
    start, seq, sent = loop.time(), 0, 0
    while True:
        due = int((loop.time() - start) / HEARTBEAT_S * len(order))  # how many should be out by now
        while sent < due:
            node = order[sent % len(order)]
            if sent % len(order) == 0:
                seq += 1
            body = bus.encode({"node": node.name, "at": time.time(), "seq": seq})
            await nc.publish(f"gpuledger.v1.heartbeat.{node.name}", body)
            sent += 1
        await asyncio.sleep(BEAT_TICK_S)


async def beat(url: str, count: int) -> None:
    """The heartbeat process: every node's heartbeat, forever (until terminated)."""
    nc = await bus.connect(url, "bench-heartbeats")
    await heartbeats(nc, fleet_of(count))


async def spawn(name: str, module: str, args: list[str], http_port: int, grpc_port: int = 0) -> Proc:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, "--log-level", "warning", stdout=asyncio.subprocess.DEVNULL
    )
    return Proc(name, process, http_port, grpc_port)


async def start_allocator(url: str, name: str, *extra: str) -> Proc:
    grpc_port, http_port = free_port(), free_port()
    args = ["--nats-url", url, "--grpc-host", "127.0.0.1", "--grpc-port", str(grpc_port)]
    args += ["--http-host", "127.0.0.1", "--http-port", str(http_port), "--stale-after-s", "3600", "--kube", "off"]
    args += extra
    return await spawn(name, "gpuledger_allocator", args, http_port, grpc_port)


async def start_placement(url: str, name: str) -> Proc:
    http_port = free_port()
    args = ["--nats-url", url, "--http-host", "127.0.0.1", "--http-port", str(http_port), "--kube", "off"]
    args += ["--stale-after-s", "3600", "--workload-refresh-s", "5"]
    return await spawn(name, "gpuledger_placement", args, http_port)


async def until_ready(http: aiohttp.ClientSession, proc: Proc, started: float, timeout_s: float = 120) -> float:
    """Seconds from ``started`` until the process's ops port answers /readyz (opened after its view loaded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.process.returncode is not None:
            raise SystemExit(f"{proc.name} exited with {proc.process.returncode}")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with http.get(f"http://127.0.0.1:{proc.http_port}/readyz") as reply:
                if reply.status == 200:
                    proc.ready_s = time.monotonic() - started
                    return proc.ready_s
        await asyncio.sleep(0.01)
    raise SystemExit(f"{proc.name} was not ready in {timeout_s:g}s")


async def scrape(http: aiohttp.ClientSession, proc: Proc) -> tuple[float, str]:
    started = time.perf_counter()
    async with http.get(f"http://127.0.0.1:{proc.http_port}/metrics") as reply:
        text = await reply.text()
    return time.perf_counter() - started, text


def metric_sum(text: str, name: str) -> float:
    """The sum of a metric's series (``name``: the name with ``{`` and, if wanted, a first label)."""
    prefix = name if "{" in name else name + "{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


ANSWER_SOURCES = ("asked", "ahead", "builtin")


async def answer_sources(http: aiohttp.ClientSession, allocators: list[Proc]) -> dict[str, float]:
    """How many of the allocators' requests took their nodes from placement asked during the
    request, from placement's answer asked ahead, or from the built-in fit (counters so far)."""
    counts = dict.fromkeys(ANSWER_SOURCES, 0.0)
    for proc in allocators:
        _, text = await scrape(http, proc)
        for source in ANSWER_SOURCES:
            counts[source] += metric_sum(text, f'gpuledger_allocator_placement_answers_total{{source="{source}"')
    return counts


def sources_between(before: dict[str, float], after: dict[str, float]) -> str:
    return ", ".join(f"{source} {after[source] - before[source]:.0f}" for source in ANSWER_SOURCES)


async def open_loop(rate: float, seconds: float, op: Callable[[int], Coroutine[Any, Any, None]]) -> float:
    """Start ``op`` every 1/rate s for ``seconds`` whatever the answers take; the rate achieved."""
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    i = 0
    while (now := loop.time()) < start + seconds:
        due = start + i / rate
        if due > now:
            await asyncio.sleep(due - now)
        tasks.append(asyncio.create_task(op(i)))
        i += 1
    await asyncio.gather(*tasks)
    return i / seconds


def one_card(owner: str) -> dict[str, Any]:
    return {"owner": {"kind": "tool", "id": owner}, "containers": [{"container": "", "request": {"count": 1}}]}


class Writer:
    """Compare-and-set writes from this process: a one-card reservation on a node, then its release."""

    def __init__(self, store: LedgerStore, nodes: list[Node]) -> None:
        self.store, self.nodes, self.rng = store, nodes, random.Random(1)
        self.held: list[tuple[NodeName, AllocationId]] = []
        self.latencies: list[float] = []
        self.errors = 0
        self.recording = True

    def _reserve(
        self, allocation_id: AllocationId, node: NodeName, count: int
    ) -> Callable[[NodeLedger | None], NodeLedger]:
        def transition(ledger: NodeLedger | None) -> NodeLedger:
            assert ledger is not None
            now = time.time()
            asks = (ContainerAsk("", Request(count=count)),)
            grants = fit_node(ledger, asks, 8)
            owner = Owner(OwnerKind.TOOL, f"cas-{allocation_id}")
            made = Allocation(
                allocation_id,
                owner,
                node,
                grants,
                AllocState.RESERVED,
                created_at=now,
                updated_at=now,
                lease_expires_at=now + 600,
                requests=tuple(a.request for a in asks),
            )
            return reserve(ledger, made)

        return transition

    async def take(self, node: NodeName, allocation_id: AllocationId, count: int = 1) -> None:
        await self.store.mutate(node, self._reserve(allocation_id, node, count))

    async def give(self, node: NodeName, allocation_id: AllocationId) -> None:
        await self.store.mutate(node, lambda ledger: release(ledger, allocation_id, time.time(), "bench"))  # type: ignore[arg-type]

    async def op(self, i: int) -> None:
        started = time.perf_counter()
        try:
            if i % 2 == 0 or not self.held:
                node = NodeName(self.rng.choice(self.nodes[1:]).name)
                allocation_id = AllocationId(f"cas-{i}")
                await self.take(node, allocation_id)
                self.held.append((node, allocation_id))
            else:
                await self.give(*self.held.pop(0))
        except Exception:  # counted; the figure says how many
            self.errors += 1
            return
        if self.recording:
            self.latencies.append(time.perf_counter() - started)


async def fan_out(
    http: aiohttp.ClientSession, writer: Writer, probe: Node, placements: list[Proc], rounds: int
) -> list[float]:
    """Take the probe node whole, then free it, and time until each replica's prioritize sees it."""
    pod = {
        "metadata": {"name": "probe", "namespace": "bench", "uid": "uid-probe"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpuledger.io/gpu": "1"}}}]},
    }
    body = {"Pod": pod, "Nodes": None, "NodeNames": [probe.name]}
    lags: list[float] = []

    async def seen(proc: Proc, want: int, since: float) -> None:
        url = f"http://127.0.0.1:{proc.http_port}/gpuledger/prioritize"
        while time.perf_counter() - since < 10:
            async with http.post(url, json=body) as reply:
                scores = await reply.json()
            if scores and scores[0]["Score"] == want:
                lags.append(time.perf_counter() - since)
                return
            await asyncio.sleep(0.001)

    for r in range(rounds):
        allocation_id = AllocationId(f"probe-{r}")
        await writer.take(NodeName(probe.name), allocation_id, count=8)
        await asyncio.gather(*(seen(p, 0, time.perf_counter()) for p in placements))
        await writer.give(NodeName(probe.name), allocation_id)
        since = time.perf_counter()
        await asyncio.gather(*(seen(p, 10, since) for p in placements))
        await asyncio.sleep(0.1)
    return lags


async def allocate_at(nc: Client, rate: float, seconds: float, tag: str) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    failed = 0

    async def op(i: int) -> None:
        nonlocal failed
        started = time.perf_counter()
        try:
            await bus.request(nc, ALLOCATE, one_card(f"{tag}-{i}"), timeout=30)
        except Exception:  # counted
            failed += 1
            return
        latencies.append(time.perf_counter() - started)

    achieved = await open_loop(rate, seconds, op)
    return latencies, failed, achieved


async def echo_at(nc: Client, rate: float, seconds: float) -> list[float]:
    latencies: list[float] = []

    async def op(i: int) -> None:
        started = time.perf_counter()
        await nc.request(ECHO_SUBJECT, b'{"x":1}', timeout=10)
        latencies.append(time.perf_counter() - started)

    await open_loop(rate, seconds, op)
    return latencies


async def run(count: int, seconds: float) -> Figures:
    figures = Figures(count)
    nodes = fleet_of(count)
    procs: list[Proc] = []
    async with embedded_nats() as server, aiohttp.ClientSession() as http:
        nc = await bus.connect(server.url, "bench")
        echo = await asyncio.create_subprocess_exec(sys.executable, "-c", ECHO, server.url, ECHO_SUBJECT)
        beating: asyncio.subprocess.Process | None = None
        try:
            imports = []
            for module in ("gpuledger_allocator.app", "gpuledger_placement.app"):
                t0 = time.monotonic()
                process = await asyncio.create_subprocess_exec(sys.executable, "-c", f"import {module}")
                await process.wait()
                imports.append(f"{module.split('.')[0]} {time.monotonic() - t0:.2f} s")
            figures.add("of which the interpreter and imports (python -c 'import ...app')", ", ".join(imports))
            first = await start_allocator(server.url, "allocator-1")
            procs.append(first)
            await until_ready(http, first, time.monotonic())
            started = time.monotonic()
            for at in range(0, count, 500):
                await announce(nc, nodes[at : at + 500])
            beating = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--beat", server.url, "--nodes", str(count)
            )
            gc.collect()
            gc.freeze()  # the fleet and what the fill left: out of every later collection's way
            gcpause.install()
            while True:
                _, text = await scrape(http, first)
                if metric_sum(text, "gpuledger_model_cards") >= 8 * count:
                    break
                await asyncio.sleep(0.2)
            figures.add("ledger filled from the inventories", f"{time.monotonic() - started:.1f} s")

            second = await start_allocator(server.url, "allocator-2")
            procs.append(second)
            figures.add("cold start, allocator replica", f"{await until_ready(http, second, time.monotonic()):.2f} s")
            placements = []
            for i in range(PLACEMENTS):
                placement = await start_placement(server.url, f"placement-{i + 1}")
                procs.append(placement)
                placements.append(placement)
                ready = await until_ready(http, placement, time.monotonic())
                figures.add(f"cold start, placement replica {i + 1}", f"{ready:.2f} s")

            store = await LedgerStore.open(nc)
            writer = Writer(store, nodes)
            load = asyncio.create_task(open_loop(CAS_RATE, seconds, writer.op))
            cpu0 = {p.name: _cpu(p) for p in placements}
            await asyncio.sleep(seconds / 2)
            writer.recording = False  # the probes below poll placement from this process
            lags = await fan_out(http, writer, nodes[0], placements, rounds=max(3, int(seconds / 4)))
            achieved = await load
            cpu = {p.name: (_cpu(p) - cpu0[p.name]) / seconds for p in placements}
            figures.add(
                f"compare-and-set at {CAS_RATE:g} writes/s, {PLACEMENTS} placement replicas watching",
                f"{p50_p99(writer.latencies)}, {writer.errors} errors, {achieved:.0f} writes/s achieved",
            )
            figures.add(
                f"watch fan-out to {PLACEMENTS} placement replicas (write acked to prioritize seeing it)",
                p50_p99(lags),
            )
            figures.add("placement CPU under that load", ", ".join(f"{n} {v * 100:.0f} %" for n, v in cpu.items()))
            while writer.held:
                await writer.give(*writer.held.pop())

            for _ in range(100):
                await nc.request(ECHO_SUBJECT, b"{}", timeout=5)
            sources = await answer_sources(http, [first, second])
            lat, failed, rate = await allocate_at(nc, ALLOCATE_RATE, seconds, "steady")
            figures.add(
                f"Allocate (NATS) at {ALLOCATE_RATE:g}/s, placement's policy rebuilt every 5 s",
                f"{p50_p99(lat)}, {failed} failed, {rate:.0f}/s achieved",
            )
            figures.add(
                "  where its nodes came from (placement asked during the request, asked ahead, built-in fit)",
                sources_between(sources, await answer_sources(http, [first, second])),
            )
            echo_lat = await echo_at(nc, ALLOCATE_RATE, min(seconds, 10))
            figures.add(f"raw nats-py echo at {ALLOCATE_RATE:g}/s", p50_p99(echo_lat))
            figures.add("Allocate p50 / echo p50", f"{statistics.median(lat) / statistics.median(echo_lat):.2f}x")
            figures.add("Allocate p99 / echo p99", f"{pct(lat, 0.99) / pct(echo_lat, 0.99):.2f}x")

            scrapes: list[float] = []

            async def scraping() -> None:
                while True:
                    await asyncio.sleep(SCRAPE_S)
                    scrapes.append((await scrape(http, first))[0])

            scraper = asyncio.create_task(scraping())
            lat2, failed2, _ = await allocate_at(nc, ALLOCATE_RATE, seconds, "scraped")
            scraper.cancel()
            figures.add(
                f"Allocate at {ALLOCATE_RATE:g}/s while /metrics is scraped every {SCRAPE_S:g} s",
                f"{p50_p99(lat2)}, {failed2} failed; scrapes p50 {statistics.median(scrapes or [0]) * 1000:.0f} ms",
            )

            burst = await asyncio.gather(
                *(bus.request(nc, ALLOCATE, one_card(f"burst-{i}"), timeout=30) for i in range(BURST)),
                return_exceptions=True,
            )
            refused = [b for b in burst if isinstance(b, BaseException)]
            why = f" (first: {str(refused[0])[:120]})" if refused else ""
            free = 8 * count - len(lat) - len(lat2)
            figures.add(
                f"burst of {BURST} one-card Allocates at once", f"{len(refused)} refused{why}, ~{free} cards free"
            )

            took, text = await scrape(http, first)
            series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
            figures.add("/metrics scrape, alone", f"{took * 1000:.0f} ms, {len(text) / 1e6:.2f} MB, {series} series")
            inspect = [
                sys.executable,
                "-m",
                "gpuledger_cli",
                "inspect",
                "--json",
                "--server",
                f"127.0.0.1:{first.grpc_port}",
            ]
            t0 = time.perf_counter()
            listing = await asyncio.create_subprocess_exec(*inspect, stdout=asyncio.subprocess.PIPE)
            out, _ = await listing.communicate()
            figures.add(
                "gpuledger inspect --json (pages of 100 nodes, 15 s deadline each)",
                f"{time.perf_counter() - t0:.1f} s, exit {listing.returncode}, {len(out) / 1e6:.1f} MB of JSON",
            )
            listings = 0

            async def listing_loop() -> None:
                nonlocal listings
                while True:
                    process = await asyncio.create_subprocess_exec(*inspect, stdout=asyncio.subprocess.DEVNULL)
                    try:
                        await process.wait()
                    finally:
                        if process.returncode is None:  # cancelled mid-listing
                            process.terminate()
                            await process.wait()
                    listings += process.returncode == 0

            lister = asyncio.create_task(listing_loop())
            lat3, failed3, _ = await allocate_at(nc, ALLOCATE_RATE, seconds / 2, "listed")
            lister.cancel()
            figures.add(
                f"Allocate at {ALLOCATE_RATE:g}/s while gpuledger inspect lists the cluster over and over",
                f"{p50_p99(lat3)}, {failed3} failed; {listings} whole listings done",
            )
            figures.add("RSS", ", ".join(f"{p.name} {rss_mib(p.process.pid):.0f} MiB" for p in procs))

            # One allocator replica answering, as the issue measured it, with placement's answers
            # asked ahead (the default) and then without (a replica started with them off).
            for proc in (second, first):
                proc.process.terminate()
                await proc.process.wait()
                procs.remove(proc)
            for label, extra in (
                ("answers asked ahead", ()),
                ("placement asked during each", ("--placement-ahead-s", "0")),
            ):
                alone = await start_allocator(server.url, f"allocator-{label}", *extra)
                procs.append(alone)
                await until_ready(http, alone, time.monotonic())
                for i in range(100):
                    await bus.request(nc, ALLOCATE, one_card(f"warm-{label}-{i}"), timeout=30)
                sources = await answer_sources(http, [alone])
                lat4, failed4, _ = await allocate_at(nc, ALLOCATE_RATE, seconds, label.split()[0])
                figures.add(
                    f"Allocate at {ALLOCATE_RATE:g}/s, one allocator replica, {label}",
                    f"{p50_p99(lat4)}, {failed4} failed; nodes from: "
                    f"{sources_between(sources, await answer_sources(http, [alone]))}",
                )
                alone.process.terminate()
                await alone.process.wait()
                procs.remove(alone)
            echo_lat = await echo_at(nc, ALLOCATE_RATE, min(seconds, 10))
            figures.add(f"raw nats-py echo at {ALLOCATE_RATE:g}/s, again", p50_p99(echo_lat))
        finally:
            if beating is not None:
                beating.terminate()
                await beating.wait()
            gcpause.uninstall()
            gc.unfreeze()
            for proc in procs:
                proc.process.terminate()
            echo.terminate()
            for process in [p.process for p in procs] + [echo]:
                await process.wait()
            await nc.close()
    return figures


def _cpu(proc: Proc) -> float:
    with open(f"/proc/{proc.process.pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


async def main(sizes: list[int], seconds: float) -> None:
    print(f"ledger scale benchmark: nodes of 8 H100, {seconds:g} s per load phase, sizes {sizes}", flush=True)
    results = [await run(size, seconds) for size in sizes]
    rows = list(dict.fromkeys(row for r in results for row in r.rows))
    print()
    print("| figure | " + " | ".join(f"{r.nodes} nodes" for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for row in rows:
        print(f"| {row} | " + " | ".join(r.rows.get(row, "") for r in results) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="500,5000", help="comma list of fleet sizes")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--beat", metavar="NATS_URL", help=argparse.SUPPRESS)  # the heartbeat process
    args = parser.parse_args()
    if args.beat:
        asyncio.run(beat(args.beat, int(args.nodes)))
    else:
        asyncio.run(main([int(n) for n in args.nodes.split(",")], args.seconds))
