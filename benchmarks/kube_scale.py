"""Scale through Kubernetes: ``--nodes`` kwok nodes of 8 H100 and ``--pods`` one-card pods through a
real kube-scheduler with gpuledger's extender, next to the same pods asking a plain extended resource
of a kube-scheduler without extender, same run, same nodes.

A real kube-apiserver, kube-controller-manager, etcd and kwok (built from Go modules on first use),
nats-server, the allocator and placement as their own processes. The nodes' inventories and
heartbeats are published on NATS by this script, as each node's inventory would (no process per
node), and each Node's status advertises ``gpuledger.io/gpu`` (8 cards x slots) and the plain
resource, as the device plugins would; no kubelet admits the pods (binding is what is measured).
For each path: pods per second from the first create to the last bind, the p50/p99 time from a
pod's creation to its bind (from a watch), and for gpuledger the extender's CPU per pod.

    python -m benchmarks.kube_scale [--nodes 1000] [--pods 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD
from gpuledger_dev.controlplane.api import STRATEGIC, KubeApi
from gpuledger_dev.controlplane.cluster import ControlPlane, plain_scheduler_config, scheduler_config
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import embedded_nats, free_port
from gpuledger_dev.processes import Supervisor
from gpuledger_dev.real_cluster import node_object
from tests.support.benchpods import PLAIN, cpu_seconds, one_card_pods
from tests.support.waiting import wait_for

NAMESPACE = "scale"


def pods(kind: str, count: int) -> list[dict[str, Any]]:
    return one_card_pods(kind, count, NAMESPACE, kind, "scale")


async def burst(api: KubeApi, kind: str, count: int) -> dict[str, float]:
    listed = await api.get(f"/api/v1/namespaces/{NAMESPACE}/pods", limit="1")
    version = listed["metadata"]["resourceVersion"]
    created: dict[str, float] = {}
    bound: dict[str, float] = {}

    async def follow() -> None:
        nonlocal version
        while len(bound) < count:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                path = f"/api/v1/namespaces/{NAMESPACE}/pods"
                async for event in api.watch(path, version, 300, labelSelector=f"scale={kind}"):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"the watch failed: {obj}")
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    name = obj["metadata"].get("name")
                    if name and obj.get("spec", {}).get("nodeName") and name not in bound:
                        bound[name] = time.monotonic()
                    if len(bound) >= count:
                        return

    following = asyncio.create_task(follow())
    sem = asyncio.Semaphore(32)
    started = time.monotonic()

    async def create(body: dict[str, Any]) -> None:
        async with sem:
            created[body["metadata"]["name"]] = time.monotonic()
            await api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)

    await asyncio.gather(*(create(b) for b in pods(kind, count)))
    await asyncio.wait_for(following, 1800)
    ended = max(bound.values())
    waits = sorted(bound[n] - created[n] for n in bound)
    return {
        "pods/s": count / (ended - started),
        "p50 s": statistics.median(waits),
        "p99 s": waits[int(len(waits) * 0.99) - 1],
        "seconds": ended - started,
    }


async def clear(api: KubeApi, kind: str, count: int) -> None:
    """Delete the burst's pods one by one (a collection delete of thousands outlasts the API
    server's request timeout)."""
    sem = asyncio.Semaphore(32)

    async def delete(name: str) -> None:
        async with sem:
            with contextlib.suppress(Exception):
                await api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", grace_s=0)

    await asyncio.gather(*(delete(p["metadata"]["name"]) for p in pods(kind, count)))

    async def gone() -> bool:
        found = await api.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"scale={kind}", limit="1")
        return not found["items"]

    await wait_for(gone, 600, f"{kind} pods gone", interval=1.0)


async def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="gl-scale-"))
    names = [f"kwok-{i:04d}" for i in range(args.nodes)]
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: {n}\n    profile: h100-sxm-8\n" for n in names))
    gpus = str(8 * DEFAULT_SLOTS_PER_CARD)
    with ControlPlane(work / "cp") as control_plane:
        assert control_plane.access is not None
        kubeconfig = control_plane.access.kubeconfig(work / "kubeconfig")
        async with KubeApi(control_plane.access, timeout_s=600) as api, embedded_nats() as nats:
            await api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            started = time.monotonic()
            sem = asyncio.Semaphore(32)

            async def add_node(name: str) -> None:
                async with sem:
                    await api.create("/api/v1/nodes", node_object(name))
                    capacity = {PLAIN: "8", "gpuledger.io/gpu": gpus}
                    status = {"status": {"capacity": capacity, "allocatable": capacity}}
                    await api.patch(f"/api/v1/nodes/{name}/status", status, STRATEGIC)

            await asyncio.gather(*(add_node(n) for n in names))
            print(f"{args.nodes} kwok nodes in {time.monotonic() - started:.0f} s", flush=True)
            supervisor = Supervisor(work)
            try:
                await supervisor.start(
                    "allocator",
                    "gpuledger_allocator",
                    ["--nats-url", nats.url, "--http-host", "127.0.0.1", "--http-port", str(free_port()),
                     "--grpc-host", "127.0.0.1", "--grpc-port", str(free_port()),
                     "--kube", "kubeconfig", "--kubeconfig", str(kubeconfig)],
                )  # fmt: skip
                placement_port = free_port()
                placement = await supervisor.start(
                    "placement",
                    "gpuledger_placement",
                    ["--nats-url", nats.url, "--http-host", "127.0.0.1", "--http-port", str(placement_port),
                     "--kube", "kubeconfig", "--kubeconfig", str(kubeconfig)],
                )  # fmt: skip
                nc = await bus.connect(nats.url, "kube-scale")
                stop = asyncio.Event()

                async def heartbeats() -> None:
                    while not stop.is_set():
                        await announce(nc, [n.node for n in fleet.nodes])
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), 5.0)

                beating = asyncio.create_task(heartbeats())
                async with aiohttp.ClientSession() as http:

                    async def ready() -> bool:
                        async with http.get(f"http://127.0.0.1:{placement_port}/readyz") as reply:
                            return reply.status == 200

                    await wait_for(ready, 120, "placement ready", interval=0.5)
                extender = f"http://127.0.0.1:{placement_port}/gpuledger"
                ours_config = scheduler_config(extender)
                await asyncio.to_thread(control_plane.start_scheduler, "gpuledger-scheduler", ours_config)
                await asyncio.to_thread(
                    control_plane.start_scheduler, "plain-scheduler", plain_scheduler_config("plain-scheduler")
                )
                rows: dict[str, dict[str, float]] = {}
                rows["plain extended resource, no extender"] = await burst(api, "plain", args.pods)
                print("plain:", rows["plain extended resource, no extender"], flush=True)
                await clear(api, "plain", args.pods)
                assert placement.process is not None
                cpu_before = cpu_seconds(placement.process.pid)
                ours = await burst(api, "gpuledger", args.pods)
                ours["extender CPU ms/pod"] = (cpu_seconds(placement.process.pid) - cpu_before) / args.pods * 1000
                rows["gpuledger extender (filter + bind)"] = ours
                print("gpuledger:", ours, flush=True)
                stop.set()
                await beating
                await nc.close()
            finally:
                await supervisor.stop()
    print()
    print(f"{args.pods} one-card pods on {args.nodes} kwok nodes x 8 H100")
    print("| path | pods/s | p50 create->bound (s) | p99 create->bound (s) | extender CPU ms/pod |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        cpu = f"{row['extender CPU ms/pod']:.2f}" if "extender CPU ms/pod" in row else "-"
        print(f"| {name} | {row['pods/s']:.1f} | {row['p50 s']:.2f} | {row['p99 s']:.2f} | {cpu} |")
    plain, ours_row = rows["plain extended resource, no extender"], rows["gpuledger extender (filter + bind)"]
    print(f"ratio gpuledger / plain (pods/s): {ours_row['pods/s'] / plain['pods/s']:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
