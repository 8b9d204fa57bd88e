"""``gpuledger dev up``: the whole stack as local processes on a simulated fleet.

It starts an embedded nats-server and the allocator as its own process, announces the fleet's
nodes, runs the demo scenario through the gRPC API, prints the ledger and keeps running until
Ctrl-C (or exits with ``--once``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.fleet import Fleet, FleetError, load_fleet
from gpuledger_common.natsserver import embedded_nats, free_port
from gpuledger_cli import render
from gpuledger_cli.client import allocator
from gpuledger_cli.scenario import run_scenario
from gpuledger_common import pbconvert as conv
from gpuledger_proto.gpuledger.allocator import v1 as pb

DEFAULT_FLEET = Path(__file__).resolve().parents[2] / "deploy" / "fleet" / "dev.yaml"
HEARTBEAT_S = 5.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="the local development stack")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    up = dev_sub.add_parser("up", help="run the whole stack on a simulated fleet")
    up.add_argument("--fleet", default=str(DEFAULT_FLEET), help="fleet file (YAML)")
    up.add_argument("--once", action="store_true", help="run the scenario, print the result and exit")
    up.add_argument("--grpc-port", type=int, default=0, help="allocator gRPC port (0: any free port)")
    up.set_defaults(run=dev_up)


def say(message: str) -> None:
    print(f"[dev up] {message}", flush=True)


async def dev_up(args: argparse.Namespace) -> int:
    try:
        fleet = load_fleet(args.fleet)
    except (FleetError, OSError) as err:
        print(f"gpuledger dev up: fleet file: {err}", file=sys.stderr)
        return 2
    say(f"fleet {fleet.path}: {len(fleet.nodes)} node(s), {sum(len(n.node.cards) for n in fleet.nodes)} card(s)")
    async with embedded_nats() as nats_server:
        say(f"nats-server with JetStream on {nats_server.url}")
        grpc_port = args.grpc_port or free_port()
        async with _allocator_process(nats_server.url, grpc_port) as process:
            server = f"127.0.0.1:{grpc_port}"
            await _wait_ready(server, process)
            say(f"allocator (pid {process.pid}) serving gRPC on {server}")
            nc = await bus.connect(nats_server.url, "gpuledger-dev")
            try:
                return await _run(args, fleet, server, nc, process)
            finally:
                await nc.drain()


async def _run(
    args: argparse.Namespace, fleet: Fleet, server: str, nc: Client, process: asyncio.subprocess.Process
) -> int:
    nodes = [n.node for n in fleet.nodes]
    await announce(nc, nodes)
    await _wait_nodes(server, len(nodes))
    say("every node is in the ledger; running the demo scenario")
    ok = await run_scenario(server, say)
    async with allocator(server) as api:
        reply = await api.get_cluster(pb.GetClusterRequest())
    print(render.cluster([conv.node_status_from(n) for n in reply.nodes]), flush=True)
    if args.once:
        say("scenario " + ("passed" if ok else "FAILED"))
        return 0 if ok else 1
    say(f"running; try: gpuledger inspect --server {server}   (Ctrl-C stops)")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    seq = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEARTBEAT_S)
        if process.returncode is not None:
            say(f"the allocator exited with {process.returncode}; stopping")
            return 1
        seq += 1
        await announce(nc, nodes, seq)
    say("stopping")
    return 0


@contextlib.asynccontextmanager
async def _allocator_process(nats_url: str, grpc_port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    log = tempfile.NamedTemporaryFile(prefix="gpuledger-allocator-", suffix=".log", delete=False)  # noqa: SIM115
    say(f"allocator log: {log.name}")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuledger_allocator",
        "--nats-url", nats_url, "--grpc-host", "127.0.0.1", "--grpc-port", str(grpc_port),
        "--http-host", "127.0.0.1", "--http-port", "0", "--stale-after-s", "60",
        stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()


async def _wait_ready(server: str, process: asyncio.subprocess.Process, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if process.returncode is not None:
            raise SystemExit(f"gpuledger dev up: the allocator exited with {process.returncode} while starting")
        with contextlib.suppress(Exception):
            async with allocator(server) as api:
                await api.get_cluster(pb.GetClusterRequest())
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"gpuledger dev up: the allocator did not answer on {server} within {timeout:g}s")


async def _wait_nodes(server: str, count: int, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        async with allocator(server) as api:
            reply = await api.get_cluster(pb.GetClusterRequest())
        if len(reply.nodes) >= count:
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"gpuledger dev up: only some of the {count} nodes reached the ledger")
