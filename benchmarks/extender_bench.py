"""The extender's filter and prioritize over HTTP, next to a bare aiohttp handler, in one run.

A synthetic ledger of 5,000 nodes x 8 cards (A100 SXM, NVLink, about half the cards partly or
wholly held) is built in memory inside the placement server's process; no NATS is involved. Each
call carries 800 node names and a real pod's JSON, as kube-scheduler sends them to a
``nodeCacheCapable`` extender. Three servers run as separate processes on this machine:

- ``bare``: an aiohttp handler that only parses the same payload and answers ``{}``;
- ``real``: the placement service's app (``gpuledger_placement.app.http_app``), with ledger churn
  in the background (``--churn`` node changes per second arrive as the watch would deliver them);

The client sends the calls one at a time, interleaved (bare, filter, prioritize), over keep-alive
connections, and reports p50/p99 and the ratio to the bare handler. Filter chooses the node for the
pod (so it also scores every node that fits) and records the pod as assumed there; every call
names the same pod, so each replaces the previous call's assumption. kube-scheduler skips
prioritize when filter leaves one node: for a GPU pod, filter is now the whole round trip. "cold" repeats the calls with
every node's cached answers dropped first (as if every node had changed since the last call). It
also times the card choice on one 8-card node.

    python -m benchmarks.extender_bench [--calls 400] [--nodes 5000] [--names 800]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

import aiohttp
from aiohttp import web

from gpuledger_common.profiles import PROFILES
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import (
    CORE_WHOLE,
    Allocation,
    AllocState,
    Card,
    CardShare,
    Grant,
    Node,
    Owner,
    OwnerKind,
    Request,
)
from gpuledger_core.packing import make_policy
from gpuledger_core.pods import PodAsk, plan
from gpuledger_dev.natsserver import free_port

MODEL = "NVIDIA A100-SXM4-80GB"
POD: dict[str, Any] = {
    "kind": "Pod",
    "apiVersion": "v1",
    "metadata": {
        "name": "trainer-7f9c6d5b8-x2k4q",
        "generateName": "trainer-7f9c6d5b8-",
        "namespace": "ml-team",
        "uid": "1d0c5f0e-8c1f-4c84-9a57-3c1b8d1f2e77",
        "resourceVersion": "48151623",
        "creationTimestamp": "2025-01-14T09:12:31Z",
        "labels": {"app": "trainer", "pod-template-hash": "7f9c6d5b8", "team": "ml"},
        "annotations": {"gpuledger.io/gpu-model": "A100", "kubectl.kubernetes.io/restartedAt": "2025-01-14T09:00:00Z"},
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-7f9c6d5b8",
             "uid": "7b1f8c2e-1111-4c2b-9d0a-6a9f1d2c3b4e", "controller": True, "blockOwnerDeletion": True}
        ],
        "managedFields": [
            {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
             "time": "2025-01-14T09:12:31Z", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                          "f:spec": {"f:containers": {'k:{"name":"trainer"}': {".": {}, "f:image": {}}}}}}
        ],
    },
    "spec": {
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}},
            {
                "name": "kube-api-access-abcde",
                "projected": {"sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]},
            },
        ],
        "containers": [
            {
                "name": "trainer",
                "image": "registry.example/ml/trainer:2.3.1",
                "command": ["python", "-m", "train"],
                "args": ["--epochs=90", "--batch-size=256"],
                "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "OMP_NUM_THREADS", "value": "8"}],
                "resources": {
                    "limits": {"cpu": "8", "memory": "64Gi", "gpuledger.io/gpu": "1",
                               "gpuledger.io/gpu-mem": "16000", "gpuledger.io/gpu-core": "25"},
                    "requests": {"cpu": "8", "memory": "64Gi", "gpuledger.io/gpu": "1",
                                 "gpuledger.io/gpu-mem": "16000", "gpuledger.io/gpu-core": "25"},
                },
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "terminationMessagePath": "/dev/termination-log",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    },
    "status": {"phase": "Pending", "qosClass": "Guaranteed"},
}  # fmt: skip


# --- the synthetic fleet (built inside the server process) ---


def node(name: str) -> Node:
    profile = PROFILES["a100-sxm-8"]()
    cards = tuple(
        Card(CardUuid(f"GPU-{name}-{i}"), i, MODEL, spec.memory_mib, spec.numa, minor=i)
        for i, spec in enumerate(profile.cards)
    )
    return Node(NodeName(name), cards, tuple(profile.links), profile.cpu_milli, profile.memory_mib)


def holdings(n: Node, rng: random.Random, serial: int) -> tuple[Allocation, ...]:
    """About half the cards held: some whole, some shared by one to three holders."""
    held: list[Allocation] = []
    for card in n.cards:
        roll = rng.random()
        if roll < 0.2:
            held.append(_hold(n, card, card.memory_mib, CORE_WHOLE, True, f"{serial}-{card.index}"))
        elif roll < 0.5:
            for k in range(rng.randint(1, 3)):
                mem, core = rng.choice((4000, 8000, 16000, 20000)), rng.choice((100, 200, 250))
                held.append(_hold(n, card, mem, core, False, f"{serial}-{card.index}-{k}"))
    return tuple(held)


def _hold(n: Node, card: Card, mem: int, core: int, whole: bool, tag: str) -> Allocation:
    share = CardShare(card.uuid, card.index, mem, core, whole)
    owner = Owner(OwnerKind.POD, f"uid-{tag}", "bench", f"p-{tag}")
    return Allocation(AllocationId(f"a-{tag}"), owner, n.name, (Grant("main", (share,)),), AllocState.BOUND)


def fleet(nodes: int, seed: int) -> list[NodeLedger]:
    rng = random.Random(seed)
    return [NodeLedger((n := node(f"gpu-{i:05d}")), holdings(n, rng, i)) for i in range(nodes)]


# --- servers ---


async def serve_bare(port: int) -> None:
    async def parse(request: web.Request) -> web.Response:
        json.loads(await request.read())
        return web.Response(body=b"{}", content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/bare/{verb}", parse)
    await _run(app, port)


async def serve_real(port: int, nodes: int, seed: int, churn: float) -> None:
    from gpuledger_placement.app import build, http_app
    from gpuledger_placement.kube import NoPodApi
    from gpuledger_placement.settings import PlacementSettings

    settings = PlacementSettings(kube="off", stale_after_s=0, http_port=port)
    parts = build(settings, None, NoPodApi(), None)
    ledgers = fleet(nodes, seed)
    for revision, ledger in enumerate(ledgers, start=1):
        parts.view.apply(ledger.node.name, ledger, revision)
    app = http_app(settings, parts)

    async def cold(_: web.Request) -> web.Response:
        parts.service.drop_answers()
        return web.Response(text="ok")

    app.router.add_post("/bench/cold", cold)
    churning = asyncio.create_task(_churn(parts.view, ledgers, churn, seed))
    try:
        await _run(app, port)
    finally:
        churning.cancel()


async def _churn(view: Any, ledgers: list[NodeLedger], per_second: float, seed: int) -> None:
    """Node changes as the bucket watch would deliver them: a holder comes or goes."""
    if per_second <= 0:
        return
    rng = random.Random(seed + 1)
    revision = len(ledgers) + 1
    while True:
        await asyncio.sleep(1 / per_second)
        at = rng.randrange(len(ledgers))
        ledger = ledgers[at]
        kept = ledger.allocations[1:] + ledger.allocations[:1] if ledger.allocations else ()
        ledgers[at] = replace(ledger, allocations=kept[:-1] if rng.random() < 0.5 else kept)
        revision += 1
        view.apply(ledger.node.name, ledgers[at], revision)


async def _run(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("READY", flush=True)
    await asyncio.Event().wait()


# --- the client ---


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def timed(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    started = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as reply:
        await reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{url}: HTTP {reply.status}")
    return time.perf_counter() - started


async def measure(args: argparse.Namespace, bare: str, real: str) -> dict[str, list[float]]:
    names = [f"gpu-{i:05d}" for i in sorted(random.Random(args.seed).sample(range(args.nodes), args.names))]
    body = json.dumps({"Pod": POD, "Nodes": None, "NodeNames": names}).encode()
    print(f"payload: {len(body)} bytes, {len(names)} node names, pod JSON {len(json.dumps(POD))} bytes")
    found: dict[str, list[float]] = {k: [] for k in ("bare", "filter", "prioritize", "cold filter", "cold prioritize")}
    connector = aiohttp.TCPConnector(limit=4)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.post(f"{real}/gpuledger/filter", data=body) as reply:
            check = await reply.json()
            assert check["Error"] == "", check
            fits = len(check["NodeNames"])
            failed, never = len(check["FailedNodes"]), len(check["FailedAndUnresolvableNodes"])
            print(f"filter answers {fits} of {len(names)} nodes (the one it chose; the pod is assumed there); "
                  f"{failed} failed, {never} unresolvable")  # fmt: skip
        for _ in range(20):  # warm-up
            await timed(session, f"{bare}/bare/filter", body)
            await timed(session, f"{real}/gpuledger/filter", body)
            await timed(session, f"{real}/gpuledger/prioritize", body)
        for _ in range(args.calls):
            found["bare"].append(await timed(session, f"{bare}/bare/filter", body))
            found["filter"].append(await timed(session, f"{real}/gpuledger/filter", body))
            found["prioritize"].append(await timed(session, f"{real}/gpuledger/prioritize", body))
        for _ in range(max(1, args.calls // 4)):
            async with session.post(f"{real}/bench/cold") as reply:
                await reply.read()
            found["cold filter"].append(await timed(session, f"{real}/gpuledger/filter", body))
            async with session.post(f"{real}/bench/cold") as reply:
                await reply.read()
            found["cold prioritize"].append(await timed(session, f"{real}/gpuledger/prioritize", body))
    return found


def card_choice(repeats: int = 300) -> list[tuple[str, float, float]]:
    """Cards for one pod on one 8-card NVLink node, as bind chooses them (``pods.plan``)."""
    n = node("one")
    rng = random.Random(7)
    busy, idle = NodeLedger(n, holdings(n, rng, 0)[:2]), NodeLedger(n)
    policy = make_policy("default")
    owner = Owner(OwnerKind.POD, "uid-x", "bench", "x")
    out = []
    for label, ledger, request in (
        ("1 card, shared", busy, Request(1, 16000, 250)),
        ("2 whole cards", busy, Request(2)),
        ("4 whole cards", busy, Request(4)),
        ("4 whole, idle", idle, Request(4)),
        ("8 whole, idle", idle, Request(8)),
    ):
        pod = PodAsk(owner, (ContainerAsk("main", request),))
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            plan(ledger, pod, policy, slots_per_card=8)
            samples.append(time.perf_counter() - started)
        out.append((label, pct(samples, 0.5), pct(samples, 0.99)))
    return out


def start(mode: list[str]) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, __file__, *mode], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if "READY" not in line:
        process.kill()
        raise RuntimeError(f"server {mode} did not start: {line!r}")
    return process


async def main(args: argparse.Namespace) -> int:
    print("card choice on one 8-card node (pods.plan, as bind does it):")
    for label, p50, p99 in card_choice():
        print(f"  {label:16} p50 {p50:6.3f} ms  p99 {p99:6.3f} ms")
    bare_port, real_port = free_port(), free_port()
    started = time.perf_counter()
    real = ["--serve", "real", "--port", str(real_port), "--nodes", str(args.nodes), "--churn", str(args.churn)]
    servers = await asyncio.to_thread(lambda: [start(["--serve", "bare", "--port", str(bare_port)]), start(real)])
    print(f"servers up in {time.perf_counter() - started:.1f}s ({args.nodes} nodes x 8 cards in the ledger)")
    try:
        found = await measure(args, f"http://127.0.0.1:{bare_port}", f"http://127.0.0.1:{real_port}")
    finally:
        for server in servers:
            server.kill()
            server.wait()
    bare50, bare99 = pct(found["bare"], 0.5), pct(found["bare"], 0.99)
    targets = "targets: p99 <= 50 ms, p50 <= 3x bare"
    print(f"\n{'call':18} {'p50 ms':>8} {'p99 ms':>8} {'p50/bare':>9} {'mean ms':>8}   {targets}")
    for key, values in found.items():
        p50, p99 = pct(values, 0.5), pct(values, 0.99)
        ratio = f"{p50 / bare50:8.2f}x" if key != "bare" else "        -"
        print(f"{key:18} {p50:8.2f} {p99:8.2f} {ratio} {statistics.mean(values) * 1000:8.2f}")
    verbs = ("filter", "prioritize")
    ok = all(pct(found[k], 0.99) <= 50 and pct(found[k], 0.5) <= 3 * bare50 for k in verbs)
    print(f"\nbare handler: p50 {bare50:.2f} ms, p99 {bare99:.2f} ms; warm targets {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--names", type=int, default=800)
    parser.add_argument("--churn", type=float, default=50.0, help="node changes per second on the real server")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--serve", choices=("bare", "real"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve == "bare":
        asyncio.run(serve_bare(options.port))
    elif options.serve == "real":
        asyncio.run(serve_real(options.port, options.nodes, options.seed, options.churn))
    else:
        raise SystemExit(asyncio.run(main(options)))
