"""The allocator subcommands: alloc, release, inspect."""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from gpuledger_common import pbconvert as conv
from gpuledger_common import render
from gpuledger_common.allocator_client import DEFAULT_TIMEOUT_S, ClientTls, allocator, cluster_nodes
from gpuledger_common.settings import env_default
from gpuledger_core import codec, codec_status
from gpuledger_core.errors import InvalidArgument, Unavailable
from gpuledger_core.model import CORE_WHOLE, MIG_SMALLEST
from gpuledger_proto.gpuledger.allocator import v1 as pb

DEFAULT_SERVER = "127.0.0.1:50051"
PAGE_SIZE = 100  # nodes per GetCluster call of inspect
MAX_PAGE_SIZE = 1000  # the allocator answers at most this many per call


def add_server(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=DEFAULT_SERVER, help="allocator gRPC address HOST:PORT")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds to wait for the allocator's answer (gRPC deadline; default %(default)g)",
    )
    for flag, what in (
        ("ca-file", "CA that verifies the allocator: turns on TLS"),
        ("cert-file", "this tool's client certificate (its common name is who the allocator sees)"),
        ("key-file", "the client certificate's private key"),
    ):
        env = f"grpc_{flag.replace('-', '_')}"
        p.add_argument(f"--{flag}", default=env_default(env, ""), help=f"{what} (env GPULEDGER_{env.upper()})")


def tls_of(args: argparse.Namespace) -> ClientTls:
    return ClientTls(args.ca_file, args.cert_file, args.key_file)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("alloc", help="allocate cards for a tool outside Kubernetes")
    add_server(p)
    p.add_argument("--gpu", type=int, default=1, help="number of distinct cards")
    p.add_argument("--gpu-mem", type=int, help="MiB on each card (shares the card)")
    p.add_argument("--gpu-core", type=int, help="percent of each card's compute (shares the card)")
    p.add_argument("--model", action="append", default=[], help="allowed card model (repeatable)")
    p.add_argument(
        "--mig",
        default="",
        help=f"a MIG instance on each card: a profile (1g.10gb), or {MIG_SMALLEST} (the smallest profile "
        "holding --gpu-mem and --gpu-core)",
    )
    p.add_argument("--owner", default="", help="the tool's id; retrying with the same id returns the same allocation")
    p.add_argument("--node", default="", help="only this node")
    p.add_argument("--isolation", default="none", choices=["none", "mps"])
    p.add_argument("--lease", type=int, default=0, help="seconds a reservation lives (with --reserve-only)")
    p.add_argument("--reserve-only", action="store_true", help="reserve with a lease instead of committing")
    p.set_defaults(run=alloc)

    p = sub.add_parser("release", help="release an allocation")
    add_server(p)
    p.add_argument("allocation_id")
    p.add_argument("--reason", default="released by gpuledger CLI")
    p.set_defaults(run=release)

    p = sub.add_parser("inspect", help="cluster -> node -> card -> holders")
    add_server(p)
    p.add_argument("--node", default="", help="only this node")
    p.add_argument("--model", default="", help="only cards of this model")
    p.add_argument(
        "--page-size",
        type=int,
        default=PAGE_SIZE,
        help="nodes per call; each call has the --timeout deadline (default %(default)d)",
    )
    p.set_defaults(run=inspect)


def _request(args: argparse.Namespace) -> pb.ResourceRequest:
    core = args.gpu_core
    if core is not None and not 1 <= core <= 100:
        raise InvalidArgument("--gpu-core", f"must be 1..100 percent, got {core}")
    return pb.ResourceRequest(
        gpu=args.gpu,
        gpu_mem_mib=args.gpu_mem,
        gpu_core_permille=None if core is None else core * CORE_WHOLE // 100,
        models=args.model,
        mig=args.mig,
    )


async def alloc(args: argparse.Namespace) -> int:
    owner = args.owner or f"cli-{uuid.uuid4().hex[:8]}"
    request = pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id=owner),
        containers=[pb.ContainerRequest(container="", request=_request(args))],
        isolation=args.isolation,
        lease_seconds=args.lease,
        commit=not args.reserve_only,
        node=args.node,
    )
    try:
        async with allocator(args.server, args.timeout, tls_of(args)) as api:
            reply = await api.allocate(request)
    except Unavailable as err:
        if args.owner:
            raise
        # The allocation may have been written: only the same owner, asked again, can find it.
        raise Unavailable(f"{err} (this request's owner was {owner}: run again with --owner {owner})") from err
    allocation = conv.allocation_from(reply.allocation)
    if args.json:
        _print_json({"allocation": codec.allocation_to(allocation), "existing": reply.existing})
    else:
        print(("already held: " if reply.existing else "") + render.allocation(allocation))
    return 0


async def release(args: argparse.Namespace) -> int:
    async with allocator(args.server, args.timeout, tls_of(args)) as api:
        reply = await api.release(pb.ReleaseRequest(allocation_id=args.allocation_id, reason=args.reason))
    allocation = conv.allocation_from(reply)
    if args.json:
        _print_json({"allocation": codec.allocation_to(allocation)})
    else:
        print(render.allocation(allocation))
    return 0


async def inspect(args: argparse.Namespace) -> int:
    if not 1 <= args.page_size <= MAX_PAGE_SIZE:
        raise InvalidArgument("--page-size", f"must be 1..{MAX_PAGE_SIZE} nodes, got {args.page_size}")
    async with allocator(args.server, args.timeout, tls_of(args)) as api:
        nodes = await cluster_nodes(api, args.node, args.model, args.page_size)
    if args.json:
        _print_json({"nodes": [codec_status.node_status_to(n) for n in nodes]})
    else:
        print(render.cluster(nodes))
    return 0


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))
