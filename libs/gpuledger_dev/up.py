"""``gpuledger dev up``: the whole stack as local processes on a simulated fleet.

An embedded nats-server (TLS, a user per role and node, as deployed); the allocator, placement,
and for every node of the fleet an inventory (fake NVML) and a plugin shim, each its own process;
a simulated API server, scheduler and kubelets. It runs the demo scenario, prints the ledger,
serves the dashboard and keeps running until Ctrl-C (``--once``: exit after the scenario,
non-zero if anything in it went wrong).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from importlib import resources
from pathlib import Path

from gpuledger_common import render
from gpuledger_common.allocator_client import allocator, cluster_nodes
from gpuledger_common.entry import stop_on_signals
from gpuledger_dev.controlplane.build import BuildError
from gpuledger_dev.controlplane.cluster import ControlPlaneError
from gpuledger_dev.fleet import FleetError, load_fleet
from gpuledger_dev.local_stack import KUBERNETES, Stack, kubectl_of, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.processes import ServiceDied
from gpuledger_dev.real_cluster import DRA_ALLOCATIONS, MODES, RealCluster
from gpuledger_dev.realnode.images import ImageError
from gpuledger_dev.realnode.node import NodeError
from gpuledger_dev.scenario import run_scenario
from gpuledger_dev.scenario_dra import run_dra_scenario

DEFAULT_FLEET = Path(str(resources.files("gpuledger_dev") / "fleets" / "dev.yaml"))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="the local development stack")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    up = dev_sub.add_parser("up", help="run the whole stack on a simulated fleet")
    up.add_argument("--fleet", default=str(DEFAULT_FLEET), help="fleet file (YAML)")
    up.add_argument("--once", action="store_true", help="run the scenario, print the result and exit")
    up.add_argument("--grpc-port", type=int, default=0, help="allocator gRPC port (0: any free port)")
    up.add_argument("--dashboard-port", type=int, default=8080, help="dashboard port (0: any free port)")
    up.add_argument(
        "--kubernetes",
        choices=KUBERNETES,
        default="fake",
        help="fake: the dev mode's fake API server, scheduler and kubelets (quick); real: a real kube-apiserver, "
        "kube-scheduler and kube-controller-manager with kwok nodes (built from Go modules on first use)",
    )
    up.add_argument(
        "--mode",
        choices=MODES,
        default="classic",
        help="classic: the device plugin and the extender; dra: every node a DRA driver's, claims decided by the "
        "ledger (needs --kubernetes real)",
    )
    up.add_argument(
        "--real-node",
        default="",
        metavar="NODE",
        help="run this node of the fleet with a real kubelet and containerd, its pods as real containers (as "
        "root; needs --kubernetes real; kubelet, containerd and runc are built from Go modules on first use)",
    )
    up.add_argument(
        "--dra-allocation",
        choices=DRA_ALLOCATIONS,
        default="ledger",
        help="with --mode dra: ledger (mode C: the ledger allocates the claims with its policy, docs/dra-mode-c.md) "
        "or scheduler (mode B: kube-scheduler allocates first-fit, the ledger commits or refuses)",
    )
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
    stop = stop_on_signals()
    try:
        for flag, given in (("--mode dra", args.mode == "dra"), ("--real-node", bool(args.real_node))):
            if given and args.kubernetes != "real":
                print(f"gpuledger dev up: {flag} needs --kubernetes real", file=sys.stderr)
                return 2
        if args.real_node and args.real_node not in {n.node.name for n in fleet.nodes}:
            names = ", ".join(n.node.name for n in fleet.nodes)
            print(f"gpuledger dev up: --real-node {args.real_node}: not in the fleet ({names})", file=sys.stderr)
            return 2
        ports = args.dashboard_port or free_port(), args.grpc_port or free_port()
        stack_cm = running_stack(
            fleet, *ports, say, args.kubernetes, args.mode, args.real_node, dra_allocation=args.dra_allocation
        )
        async with stack_cm as stack:
            return await _run(stack, args.once, stop)
    except ServiceDied as err:
        print(f"gpuledger dev up: {err}", file=sys.stderr)
        return 1
    except (TimeoutError, ControlPlaneError, BuildError, NodeError, ImageError) as err:
        print(f"gpuledger dev up: {err}", file=sys.stderr)
        return 1


async def _run(stack: Stack, once: bool, stop: asyncio.Event) -> int:
    dra = isinstance(stack.cluster, RealCluster) and stack.cluster.mode == "dra"
    say("running the demo scenario" + (" in DRA mode" if dra else ""))
    ok = await (run_dra_scenario(stack, say) if dra else run_scenario(stack, say))
    stack.supervisor.check()
    async with allocator(stack.grpc) as api:
        listed = await cluster_nodes(api)
    print(render.cluster(listed), flush=True)
    say("scenario " + ("passed" if ok else "FAILED"))
    if once:
        return 0 if ok else 1
    say(f"dashboard: {stack.dashboard}   gRPC: {stack.grpc}   NATS: {stack.nats_url}")
    op = stack.operator
    say(
        f"  NATS as the operator: --nats-user {op.user} --nats-password-file {op.password_file} "
        f"--nats-ca-file {op.ca_file}"
    )
    say(f"try: gpuledger inspect --server {stack.grpc}   (Ctrl-C stops everything)")
    if isinstance(stack.cluster, RealCluster):
        say(f"try: {kubectl_of(stack.cluster)} --kubeconfig {stack.cluster.kubeconfig} get pods -n demo -o wide")
    watching = asyncio.create_task(stack.supervisor.watch())
    stopping = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait({watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if watching in done:
            watching.result()  # raises ServiceDied
    finally:
        for task in (watching, stopping):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ServiceDied):
                await task
    say("stopping")
    return 0
