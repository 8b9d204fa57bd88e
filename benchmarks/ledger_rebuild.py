"""Rebuilding the ledger from the pods' annotations after it was lost, on a real kube-apiserver.

A real control plane (etcd, kube-apiserver, kube-controller-manager and kwok, built from Go modules
on first use; no scheduler), ``--nodes`` kwok nodes of 8 H100 whose inventories this script
publishes on NATS (as each node's inventory service would), and ``--pods`` one-card pods, each
placed on a node (``spec.nodeName``, so kwok runs them) and carrying the ``gpuledger.io/allocation``
annotation placement's bind writes, owned by the pod's UID. The allocations are in no ledger: the
pods were made while no allocator ran, as after a lost bucket.

Then an allocator replica starts, cold, and this script measures, from its process start: when it
is ready (its view loaded), when its pod watch has listed the pods, and when every annotated
allocation is back in the ledger (its ``gpuledger_allocator_reconcile_rebuilt_total``, read every
``POLL_S``; on the rebuilt ledger: its first round). It then
checks the ledger (every pod's allocation live, bound, on its node; no card held twice), and
starts a replica again on the full ledger: it must rebuild nothing.

    python -m benchmarks.ledger_rebuild [--nodes 1000] [--pods 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_common.store import LedgerStore
from gpuledger_core.fit import share_for
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.model import Allocation, AllocState, Grant, Node, Owner, OwnerKind, Request
from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.controlplane.cluster import ControlPlane
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import embedded_nats, free_port
from gpuledger_dev.processes import Supervisor
from gpuledger_dev.real_cluster import node_object
from gpuledger_placement.convert import ALLOCATION_ANNOTATION, allocation_annotation

NAMESPACE = "rebuild"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CARDS = 8
IN_FLIGHT = 32  # API requests at once while the pods are made
POLL_S = 0.25  # how often the replica's /metrics is read (a scrape of 1,000 nodes costs it ~20 ms)


def annotated(node: Node, card: int, uid: str, name: str) -> str:
    """The annotation placement's bind would have written for pod ``name`` holding one whole card."""
    now = time.time()
    share = share_for(node.cards[card], Request(count=1))
    return allocation_annotation(
        Allocation(
            id=AllocationId(f"a-{name}"),
            owner=Owner(OwnerKind.POD, uid, NAMESPACE, name),
            node=NodeName(node.name),
            grants=(Grant("app", (share,)),),
            state=AllocState.BOUND,
            created_at=now,
            updated_at=now,
            requests=(Request(count=1),),
        )
    )


def pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "gpuledger-scheduler",
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "cuda", "resources": {"limits": {"gpuledger.io/gpu": "1"}}}],
        },
    }


async def metric(http: aiohttp.ClientSession, port: int, name: str) -> float | None:
    """The counter's value on the replica's /metrics; None while the port does not answer."""
    try:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as reply:
            text = await reply.text()
    except (aiohttp.ClientError, OSError):
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


async def cold_replica(
    supervisor: Supervisor, nats_url: str, kubeconfig: Path, tag: str, want: int
) -> dict[str, float]:
    """Start an allocator replica and time its start: ready, pods listed, ``want`` rebuilt."""
    port = free_port()
    started = time.monotonic()
    replica = await supervisor.start(
        f"allocator-{tag}",
        "gpuledger_allocator",
        ["--nats-url", nats_url, "--http-host", "127.0.0.1", "--http-port", str(port),
         "--grpc-host", "127.0.0.1", "--grpc-port", str(free_port()), "--stale-after-s", "3600",
         "--kube", "kubeconfig", "--kubeconfig", str(kubeconfig), "--log-level", "warning"],
    )  # fmt: skip
    assert replica.process is not None
    figures: dict[str, float] = {}
    async with aiohttp.ClientSession() as http:
        deadline = started + 600
        while time.monotonic() < deadline:
            listed = await metric(http, port, "gpuledger_allocator_reconcile_listings_total")
            if listed is not None:
                figures.setdefault("ready s", time.monotonic() - started)
                if listed >= 1:
                    figures.setdefault("pods listed s", time.monotonic() - started)
                rebuilt = await metric(http, port, "gpuledger_allocator_reconcile_rebuilt_total") or 0.0
                rounds = await metric(http, port, "gpuledger_allocator_reconcile_rounds_total") or 0.0
                if rebuilt >= want and rounds >= 1:
                    figures["all rebuilt s"] = time.monotonic() - started
                    figures["rebuilt"] = rebuilt
                    break
            await asyncio.sleep(POLL_S)
        else:
            raise SystemExit(f"allocator-{tag}: {want} allocations not rebuilt in 600 s")
    await replica.stop()
    return figures


async def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="gl-rebuild-"))
    names = [f"kwok-{i:04d}" for i in range(args.nodes)]
    text = "nodes:\n" + "".join(f"  - name: {n}\n    profile: h100-sxm-8\n" for n in names)
    fleet = [n.node for n in parse_fleet(text).nodes]
    if args.pods > CARDS * args.nodes:
        raise SystemExit(f"--pods {args.pods}: at most {CARDS} a node, {CARDS * args.nodes} on {args.nodes} nodes")
    with ControlPlane(work / "cp") as control_plane:
        assert control_plane.access is not None
        kubeconfig = control_plane.access.kubeconfig(work / "kubeconfig")
        async with KubeApi(control_plane.access, timeout_s=600) as api, embedded_nats() as nats:
            nc = await bus.connect(nats.url, "rebuild-bench")
            store = await LedgerStore.open(nc)
            await api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            sem = asyncio.Semaphore(IN_FLIGHT)

            async def add_node(name: str) -> None:
                async with sem:
                    await api.create("/api/v1/nodes", node_object(name))

            started = time.monotonic()
            await asyncio.gather(*(add_node(n) for n in names))
            print(f"{args.nodes} kwok nodes in {time.monotonic() - started:.0f} s", flush=True)

            supervisor = Supervisor(work)
            try:
                # The ledger's nodes, as the inventories make them (an allocator writes each key).
                filler = await supervisor.start(
                    "allocator-fill",
                    "gpuledger_allocator",
                    ["--nats-url", nats.url, "--http-host", "127.0.0.1", "--http-port", str(free_port()),
                     "--grpc-host", "127.0.0.1", "--grpc-port", str(free_port()), "--kube", "off"],
                )  # fmt: skip
                started = time.monotonic()
                while len(await store.node_names()) < args.nodes:
                    await announce(nc, fleet)
                    await asyncio.sleep(1.0)
                print(f"ledger of {args.nodes} nodes in {time.monotonic() - started:.0f} s", flush=True)
                await filler.stop()

                async def add_pod(i: int) -> None:
                    node, card = fleet[i % args.nodes], i // args.nodes
                    name = f"p-{i:05d}"
                    async with sem:
                        made = await api.create(PODS, pod(name, node.name))
                        annotation = annotated(node, card, made["metadata"]["uid"], name)
                        annotations = {"metadata": {"annotations": {ALLOCATION_ANNOTATION: annotation}}}
                        await api.patch(f"{PODS}/{name}", annotations)

                started = time.monotonic()
                await asyncio.gather(*(add_pod(i) for i in range(args.pods)))
                print(f"{args.pods} annotated pods in {time.monotonic() - started:.0f} s", flush=True)

                lost = await cold_replica(supervisor, nats.url, kubeconfig, "cold", args.pods)
                print("rebuild:", lost, flush=True)
                held = [a for ledger, _ in (await store.nodes()).values() for a in ledger.live()]
                cards = [(a.node, s.uuid) for a in held for g in a.grants for s in g.cards]
                bound = sum(a.state is AllocState.BOUND for a in held)
                print(f"ledger after: {len(held)} live allocations ({bound} bound), {len(cards)} cards held, "
                      f"{len(set(cards))} distinct", flush=True)  # fmt: skip
                again = await cold_replica(supervisor, nats.url, kubeconfig, "again", 0)
                print("restart on the full ledger:", again, flush=True)
            finally:
                await supervisor.stop()
            await nc.close()
    ok = len(held) == bound == args.pods == len(set(cards)) and again["rebuilt"] == 0
    print()
    print(f"{args.pods} annotated one-card pods on {args.nodes} kwok nodes x {CARDS} H100, ledger lost")
    print("| allocator replica (s from its process start) | ready | pods listed | every allocation back | rebuilt |")
    print("|---|---|---|---|---|")
    for label, row in (("cold, beside the lost ledger", lost), ("cold again, on the rebuilt ledger", again)):
        print(f"| {label} | {row['ready s']:.2f} | {row['pods listed s']:.2f} | {row['all rebuilt s']:.2f} | "
              f"{row['rebuilt']:.0f} |")  # fmt: skip
    print("checks:", "passed" if ok else "FAILED")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
