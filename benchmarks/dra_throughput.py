"""DRA mode next to classic mode, in the same run, on the same kwok nodes: pods per second bound and
the time from a pod's creation to Running, for one-card pods of each path.

The stack is ``gpuledger dev up --kubernetes real`` with every node in both modes (``mode="both"``):
each node's inventory publishes ResourceSlices (with the binding condition) and the node runs the
device plugin shim as well as the DRA kubelet plugin; its simulated kubelet plays both the device
manager and kubelet's DRA side. Paths:

- ``classic``: ``gpuledger.io/gpu: 1`` through kube-scheduler with gpuledger's extender (filter and
  bind reserve in the ledger), admitted with the plugin shim's Allocate;
- ``dra``: a ResourceClaimTemplate of one whole card of ``gpu.gpuledger.io``; kube-controller-manager
  makes each pod's claim, kube-scheduler (a profile without the extender) allocates it and waits at
  PreBind until the claims controller has committed it in the ledger, then binds; the kubelet has
  the DRA plugin prepare the claim (CDI spec) before the pod runs;
- ``dra-ledger``: DRA mode C (docs/dra-mode-c.md): the same pods in a namespace labelled
  ``gpuledger.io/allocation=ledger``, so that the shipped admission policy gates them; placement's
  claim allocator allocates each generated claim with the ledger's policy, writes it and lifts the
  gate, and kube-scheduler binds at once (no binding-condition wait);
- ``dra-ungated``: the same as ``dra`` with the slices published without the binding condition (every
  inventory restarted with ``GPULEDGER_DRA_BINDING_CONDITIONS=false`` for these bursts, and back
  after): kube-scheduler binds at once and the claims controller only mirrors the allocation. The
  difference to ``dra`` is what the ledger's veto costs.

Rounds alternate the paths, after ``--warmup`` rounds (1) that are run the same way and not
counted: the first burst after the API server starts pays once for what the later ones find ready
(kube-apiserver fetches and parses the core API's OpenAPI schema for the gate's admission policy on
its first use, more than a second of its CPU; placement's and the scheduler's connections). Each
burst creates its pods, waits until a watch has seen them all Running, then deletes them and waits
for the ledger to give every card back. Printed: pods/s to bound and to Running (medians), the
median and p90 time from creation to Running, each pod's way from its creation as this client's
watches of pods and claims saw it (its creation answered, its claim made and allocated, the claim
named in the pod's status, the gate gone, bound, Running), the CPU seconds each program on the
machine spent per burst and the share of the cores in use (every part of the stack shares this
machine's cores, so that pods/s follow the CPU a pod costs), the ratio, and the claims
controller's time from allocation to the committed condition (its histogram). ``--pprof DIR``
starts kube-apiserver with profiling on and writes its CPU profile of each burst there.

    python -m benchmarks.dra_throughput [--nodes 8] [--pods 48] [--rounds 3] [--warmup 1] [--pprof DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.cpu_by_process import snapshot, spent
from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.controlplane.cluster import PROFILING, plain_scheduler_config
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import BOTH, DRIVER, RealCluster
from tests.support.benchpods import h100_fleet
from tests.support.ledger_check import read_ledger
from tests.support.waiting import wait_for

NAMESPACE = "bench"
NAMESPACE_C = "bench-ledger"  # labelled for mode C: its claim pods are gated and the ledger allocates
DRA_SCHEDULER = "dra-scheduler"  # a kube-scheduler profile with no extender: DRA pods need none
TEMPLATE = "one-card"
PATHS = ("classic", "dra", "dra-ledger", "dra-ungated")


def namespace_of(kind: str) -> str:
    return NAMESPACE_C if kind == "dra-ledger" else NAMESPACE


def pods(kind: str, count: int, round_name: str) -> list[dict[str, Any]]:
    toleration = [{"key": "gpuledger.io/gpu-node", "operator": "Exists", "effect": "NoSchedule"}]
    out = []
    for i in range(count):
        spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "tolerations": toleration}
        container: dict[str, Any] = {"name": "app", "image": "cuda"}
        if kind == "classic":
            spec["schedulerName"] = "gpuledger-scheduler"
            container["resources"] = {"limits": {"gpuledger.io/gpu": "1"}}
        else:
            spec["schedulerName"] = DRA_SCHEDULER
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]
            container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["containers"] = [container]
        meta = {"name": f"{kind}-{round_name}-{i:04d}", "namespace": namespace_of(kind), "labels": {"bench": kind}}
        out.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
    return out


BUSY = "(machine busy)"
MILESTONES = ("created", "claim made", "claim allocated", "pod names claim", "gate lifted", "bound", "Running")


async def burst(
    api: KubeApi,
    kind: str,
    count: int,
    round_name: str,
    seen: dict[str, list[float]] | None = None,
    cpu: dict[str, list[float]] | None = None,
) -> tuple[float, float, list[float]]:
    """Seconds until every pod was bound, until every pod ran, and each pod's creation to Running;
    ``seen`` gets each pod's MILESTONES, seconds after its creation, as this client's watches of
    pods and claims saw them; ``cpu`` each program's CPU seconds from the first creation until every
    pod ran, and under BUSY the share of the machine's cores in use then."""
    namespace = namespace_of(kind)
    path = f"/api/v1/namespaces/{namespace}/pods"
    claims_path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    selector = f"bench={kind}"
    version = (await api.get(path, labelSelector=selector, limit="1"))["metadata"]["resourceVersion"]
    claims_version = (await api.get(claims_path, limit="1"))["metadata"]["resourceVersion"]
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    running: dict[str, float] = {}
    marks: dict[str, dict[str, float]] = {}

    def mark(name: str, milestone: str, at: float) -> None:
        marks.setdefault(name, {}).setdefault(milestone, at)

    async def follow() -> None:
        while len(running) < count:
            async for event in api.watch(path, version, 600, labelSelector=selector):
                obj = event.get("object") or {}
                name = obj.get("metadata", {}).get("name", "")
                now = time.perf_counter()
                if obj.get("status", {}).get("resourceClaimStatuses"):
                    mark(name, "pod names claim", now)
                if not obj.get("spec", {}).get("schedulingGates"):
                    mark(name, "gate lifted", now)
                if obj.get("spec", {}).get("nodeName"):
                    bound.setdefault(name, now)
                    mark(name, "bound", now)
                if obj.get("status", {}).get("phase") == "Running":
                    running.setdefault(name, now)
                    mark(name, "Running", now)
                if len(running) >= count:
                    return

    async def follow_claims() -> None:
        if kind == "classic":
            return
        async for event in api.watch(claims_path, claims_version, 600):
            obj = event.get("object") or {}
            owners = [o.get("name", "") for o in obj.get("metadata", {}).get("ownerReferences") or []]
            now = time.perf_counter()
            for owner in owners:
                mark(owner, "claim made", now)
                if obj.get("status", {}).get("allocation"):
                    mark(owner, "claim allocated", now)

    sem = asyncio.Semaphore(16)
    before = snapshot()
    started = time.perf_counter()

    async def create(body: dict[str, Any]) -> None:
        async with sem:
            created[body["metadata"]["name"]] = time.perf_counter()
            await api.create(path, body)
            mark(body["metadata"]["name"], "created", time.perf_counter())

    claims = asyncio.create_task(follow_claims())
    try:
        async with asyncio.timeout(600), asyncio.TaskGroup() as tasks:
            tasks.create_task(follow())
            await asyncio.gather(*(create(b) for b in pods(kind, count, round_name)))
    finally:
        claims.cancel()
    if cpu is not None:
        after, wall = snapshot(), time.perf_counter() - started
        for name, used in spent(before, after).items():
            cpu.setdefault(name, []).append(used)
        cpu.setdefault(BUSY, []).append((after.busy_s - before.busy_s) / (after.cores * wall))
    latencies = sorted(running[n] - created[n] for n in running)
    for name, at in marks.items():
        for milestone, when in at.items():
            if name in created and seen is not None:
                seen.setdefault(milestone, []).append(when - created[name])
    return max(bound.values()) - started, max(running.values()) - started, latencies


async def clear(api: KubeApi, stack: Stack, kind: str) -> None:
    namespace = namespace_of(kind)
    await api.call(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods",
        params={"labelSelector": f"bench={kind}", "gracePeriodSeconds": "0"},
    )

    async def gone() -> bool:
        found = await api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"bench={kind}")
        claims = await api.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")
        return not found["items"] and not claims["items"]

    await wait_for(gone, 180, f"{kind} pods and claims gone", interval=0.2)

    async def free() -> bool:
        return not any(found.live() for found in (await read_ledger(stack.nats_url, stack.operator)).values())

    await wait_for(free, 180, "every card back in the ledger", interval=0.5)


async def gate(stack: Stack, api: KubeApi, on: bool) -> None:
    """Restart every inventory with the binding condition on or off, and wait for its slices."""
    os.environ["GPULEDGER_DRA_BINDING_CONDITIONS"] = "true" if on else "false"
    cluster = stack.cluster
    assert isinstance(cluster, RealCluster)
    for node in cluster.nodes:
        await stack.supervisor.restart(f"inventory-{node}")

    async def published() -> bool:
        found = (await api.get("/apis/resource.k8s.io/v1/resourceslices"))["items"]
        gated = {
            s["spec"]["nodeName"]: all(bool(d.get("bindingConditions")) == on for d in s["spec"]["devices"])
            for s in found
        }
        return set(gated) >= set(cluster.nodes) and all(gated.values())

    await wait_for(published, 120, f"every node's slices with the binding condition {'on' if on else 'off'}", 0.5)


async def histogram(url: str, name: str) -> tuple[float, float]:
    async with aiohttp.ClientSession() as http, http.get(url) as reply:
        text = await reply.text()
    found = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for part in found:
            if line.startswith(f"{name}_{part} "):
                found[part] = float(line.rsplit(" ", 1)[1])
    return found["sum"], found["count"]


def cpu_table(kinds: tuple[str, ...], cpu: dict[str, dict[str, list[float]]], rounds: int) -> None:
    """CPU seconds per burst (median over the rounds, a round without the program counting 0) of
    the programs that used the most in any path, and the share of the machine's cores in use while
    the bursts ran."""

    def per_burst(kind: str, name: str) -> float:
        values = cpu[kind].get(name, [])
        return statistics.median(values + [0.0] * (rounds - len(values)))

    top: list[str] = []
    for kind in kinds:
        ranked = sorted((n for n in cpu[kind] if n != BUSY), key=lambda n: -per_burst(kind, n))
        top.extend(n for n in ranked[:8] if n not in top)
    print(f"| CPU s per burst (median of {rounds}) | " + " | ".join(kinds) + " |")
    print("|---|" + "---:|" * len(kinds))
    for name in top:
        print(f"| {name} | " + " | ".join(f"{per_burst(k, name):.2f}" for k in kinds) + " |")
    busy = [f"{statistics.median(cpu[k][BUSY]) * 100:.0f} %" if cpu[k].get(BUSY) else "" for k in kinds]
    print("| cores in use | " + " | ".join(busy) + " |")
    print()


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


async def run(args: argparse.Namespace) -> int:
    if args.pprof is not None:
        os.environ[PROFILING] = "1"  # read when the control plane starts
    fleet = load_fleet(str(h100_fleet(Path(tempfile.mkdtemp(prefix="gl-bench-")), args.nodes)))
    say = lambda m: print(f"[stack] {m}", flush=True)  # noqa: E731
    async with running_stack(fleet, free_port(), free_port(), say, "real", mode=BOTH) as stack:
        cluster = stack.cluster
        assert isinstance(cluster, RealCluster) and cluster.api is not None
        api = cluster.api
        await api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        labelled = {"name": NAMESPACE_C, "labels": {"gpuledger.io/allocation": "ledger"}}
        await api.create("/api/v1/namespaces", {"metadata": labelled})
        request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
        template = {"metadata": {"name": TEMPLATE}, "spec": {"spec": {"devices": {"requests": [request]}}}}
        for namespace in (NAMESPACE, NAMESPACE_C):
            await api.create(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates", template)
        await asyncio.to_thread(
            cluster.control_plane.start_scheduler, DRA_SCHEDULER, plain_scheduler_config(DRA_SCHEDULER)
        )
        if args.controller_qps is not None:
            await asyncio.to_thread(cluster.control_plane.start_controller_manager, args.controller_qps)
        metrics = f"{stack.placement_ops}/metrics"
        await asyncio.sleep(2.0)
        kinds = tuple(args.paths.split(","))
        if kinds[0] != "classic" or not set(kinds) <= set(PATHS):
            raise SystemExit(f"--paths: classic first, then any of {', '.join(PATHS[1:])}; got {args.paths}")
        to_bound: dict[str, list[float]] = {k: [] for k in kinds}
        to_run: dict[str, list[float]] = {k: [] for k in kinds}
        latency: dict[str, list[float]] = {k: [] for k in kinds}
        seen: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
        cpu: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
        commit: list[float] = []
        for round_no in range(-args.warmup, args.rounds):
            counted = round_no >= 0
            for kind in kinds:
                if kind == "dra-ungated":
                    await gate(stack, api, on=False)
                before = await histogram(metrics, "gpuledger_placement_claim_commit_seconds")
                profile = None
                if args.pprof is not None:  # kube-apiserver's CPU profile over the burst
                    profile = asyncio.create_task(api.raw("/debug/pprof/profile", seconds=str(args.pprof_s)))
                name = str(round_no) if counted else f"w{-round_no}"
                bound_s, run_s, each = await burst(
                    api, kind, args.pods, name, seen[kind] if counted else None, cpu[kind] if counted else None
                )
                if profile is not None:
                    args.pprof.mkdir(parents=True, exist_ok=True)
                    (args.pprof / f"kube-apiserver-{kind}-{name}.pprof").write_bytes(await profile)
                print(
                    f"round {name} {kind:11s}: {args.pods} pods bound in {bound_s:.2f} s, "
                    f"running in {run_s:.2f} s; "
                    f"creation to Running median {statistics.median(each):.2f} s" + ("" if counted else " (warm-up)"),
                    flush=True,
                )
                await clear(api, stack, kind)
                if kind == "dra-ungated":
                    await gate(stack, api, on=True)
                if not counted:
                    continue
                to_bound[kind].append(args.pods / bound_s)
                to_run[kind].append(args.pods / run_s)
                latency[kind].extend(each)
                if kind == "dra":
                    after = await histogram(metrics, "gpuledger_placement_claim_commit_seconds")
                    if after[1] > before[1]:
                        commit.append((after[0] - before[0]) / (after[1] - before[1]))
    print()
    print(f"| path | pods/s bound (median of {args.rounds}) | pods/s Running | creation to Running, median / p90 (s) |")
    print("|---|---:|---:|---:|")
    for kind in kinds:
        values = sorted(latency[kind])
        print(
            f"| {kind} | {statistics.median(to_bound[kind]):.1f} | {statistics.median(to_run[kind]):.1f} | "
            f"{statistics.median(values):.2f} / {pct(values, 0.9):.2f} |"
        )
    print()
    print("| path | " + " | ".join(f"{m}, median / p90 (s)" for m in MILESTONES) + " |")
    print("|---|" + "---:|" * len(MILESTONES))
    for kind in kinds:
        cells = []
        for milestone in MILESTONES:
            values = sorted(seen[kind].get(milestone, []))
            cells.append(f"{statistics.median(values):.2f} / {pct(values, 0.9):.2f}" if values else "")
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print()
    cpu_table(kinds, cpu, args.rounds)
    for kind in kinds[1:]:
        ratio = statistics.median(to_run[kind]) / statistics.median(to_run["classic"])
        extra = statistics.median(latency[kind]) - statistics.median(latency["classic"])
        print(
            f"{kind} / classic, pods/s Running: {ratio:.2f}; "
            f"median creation to Running, {kind} less classic: {extra:.2f} s"
        )
    if "dra" in kinds and "dra-ungated" in kinds:
        veto = statistics.median(latency["dra"]) - statistics.median(latency["dra-ungated"])
        print(f"what the binding condition adds to the median creation to Running: {veto:.2f} s")
    if commit:
        print(
            f"claims controller, allocation to committed (mean per burst, s): {', '.join(f'{c:.3f}' for c in commit)}"
        )
    return 0


def qps_pair(raw: str) -> tuple[int, int]:
    qps, sep, burst = raw.partition(":")
    if not (sep and qps.isdigit() and burst.isdigit() and int(qps) > 0 and int(burst) > 0):
        raise argparse.ArgumentTypeError(f"must be QPS:BURST, two positive whole numbers, got {raw!r}")
    return int(qps), int(burst)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=8, help="kwok nodes of 8 H100 (default 8)")
    parser.add_argument("--pods", type=int, default=48, help="one-card pods per burst (default 48)")
    parser.add_argument("--rounds", type=int, default=3, help="bursts of each path (default 3)")
    parser.add_argument(
        "--pprof",
        type=Path,
        help="write kube-apiserver's CPU profile of each burst's first --pprof-s seconds into this folder "
        "(read with: go tool pprof -top FILE)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="rounds of every path first, not counted (default 1): the first burst after the API server "
        "starts pays once for what later ones find ready (the gate policy's schema, new connections)",
    )
    parser.add_argument("--pprof-s", type=int, default=3, help="seconds each profile covers (default 3)")
    parser.add_argument(
        "--paths", default=",".join(PATHS), help=f"comma-separated, classic first (default {','.join(PATHS)})"
    )
    parser.add_argument(
        "--controller-qps",
        type=qps_pair,
        metavar="QPS:BURST",
        help="kube-controller-manager's client limits (default its own, 20:30): it creates every templated claim",
    )
    args = parser.parse_args()
    if args.pods > args.nodes * 8:
        parser.error(f"--pods {args.pods} is more than the {args.nodes * 8} cards of --nodes {args.nodes}")
    if args.warmup < 0:
        parser.error(f"--warmup: a number of rounds, 0 or more; got {args.warmup}")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
