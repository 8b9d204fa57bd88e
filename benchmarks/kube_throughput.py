"""Pods per second bound by a real kube-scheduler through gpuledger's extender, next to the same
number of pods asking a plain extended resource with no extender, in the same run, on the same
kwok nodes.

The whole stack runs as ``gpuledger dev up --kubernetes real`` runs it (a real kube-apiserver,
kube-scheduler with deploy/scheduler/scheduler-config.yaml, kube-controller-manager, kwok nodes
with simulated kubelets; nats-server, the allocator, placement, an inventory and a plugin shim
per node). A second kube-scheduler (profile ``plain-scheduler``, no extender) binds the plain pods.
Rounds alternate plain and gpuledger bursts so drift hits both alike; each burst creates every
pod, waits until a watch has seen all bound (``spec.nodeName`` set), then deletes them and waits
for the ledger to give their cards back. While a burst is being bound the simulated kubelets hold their
admissions (both kinds of pod alike): on a cluster, admission (kubelet, the plugin shim's Allocate)
runs on the GPU nodes, while here every process shares the same 2 cores with the control plane
(``--admit-during-bursts`` measures with admission running too). Binds refused come from
placement's own counters; the extender's CPU per pod from its process's CPU time.

    python -m benchmarks.kube_throughput [--nodes 13] [--pods 100] [--rounds 3]
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

from gpuledger_common import bus
from gpuledger_common.store import LEDGER_BUCKET
from gpuledger_dev.controlplane.api import STRATEGIC, KubeApi
from gpuledger_dev.controlplane.cluster import plain_scheduler_config
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import RealCluster
from tests.support.benchpods import PLAIN, cpu_seconds, h100_fleet, one_card_pods, stat_fields
from tests.support.ledger_check import read_ledger
from tests.support.waiting import wait_for

NAMESPACE = "bench"


def pods(kind: str, count: int, round_no: int) -> list[dict[str, Any]]:
    return one_card_pods(kind, count, NAMESPACE, f"{kind}-{round_no}", "bench")


async def burst(api: KubeApi, kind: str, count: int, round_no: int) -> float:
    """Seconds from the first create until every pod is bound, as a watch of the bound pods sees
    them. (Listing the pods every 50 ms was a cost per second of burst, not per pod: it weighed on
    the slower path about three times as much, and took the machine's CPU from what is measured;
    this process alone spent 1 ms more per gpuledger pod.)"""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    selector = f"bench={kind}"
    version = (await api.get(path, labelSelector=selector, limit="1"))["metadata"]["resourceVersion"]
    bound: set[str] = set()

    async def all_bound() -> None:
        while len(bound) < count:
            async for event in api.watch(path, version, 600, labelSelector=selector, fieldSelector="spec.nodeName!="):
                if event.get("type") in ("ADDED", "MODIFIED"):
                    bound.add(event["object"]["metadata"]["name"])
                    if len(bound) >= count:
                        return

    started = time.perf_counter()
    sem = asyncio.Semaphore(16)

    async def create(body: dict[str, Any]) -> None:
        async with sem:
            await api.create(path, body)

    async with asyncio.timeout(600), asyncio.TaskGroup() as tasks:
        tasks.create_task(all_bound())
        await asyncio.gather(*(create(b) for b in pods(kind, count, round_no)))
    return time.perf_counter() - started


async def clear(api: KubeApi, kind: str) -> None:
    await api.call(
        "DELETE",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        params={"labelSelector": f"bench={kind}", "gracePeriodSeconds": "0"},
    )

    async def gone() -> bool:
        found = await api.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"bench={kind}")
        return not found["items"]

    await wait_for(gone, 120, f"{kind} pods gone", interval=0.2)


async def ledger_empty(stack: Stack) -> bool:
    return not any(found.live() for found in (await read_ledger(stack.nats_url, stack.operator)).values())


async def ledger_sequence(stack: Stack) -> int:
    """The ledger stream's last sequence: every write the ledger has taken so far."""
    nc = await bus.connect(stack.nats_url, "bench-ledger-sequence", credentials=stack.operator)
    try:
        info = await nc.jetstream().stream_info(f"KV_{LEDGER_BUCKET}")
        return int(info.state.last_seq)
    finally:
        await nc.close()


async def metric(url: str, name: str, labels: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(url) as reply:
        text = await reply.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(part in line for part in labels.split(",") if part):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def timed(url: str, verb: str) -> tuple[float, float]:
    """The extender histogram's sum (seconds) and count for ``verb``."""
    labels = f'verb="{verb}"'
    return (
        await metric(url, "gpuledger_placement_extender_seconds_sum", labels),
        await metric(url, "gpuledger_placement_extender_seconds_count", labels),
    )


def _label(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [w.decode(errors="replace") for w in argv if w]
    if not words:
        return "?"
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words):
            return words[i + 1].removeprefix("gpuledger_")
    return Path(words[0]).name


def cpu_by_process() -> dict[str, float]:
    """CPU seconds so far of this process and every descendant, summed by program (the benchmark
    itself runs the simulated kubelets; ``plugin`` sums every node's shim)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(stat_fields(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue
    ours, grew = {os.getpid()}, True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in ours} - ours
        ours |= found
        grew = bool(found)
    totals: dict[str, float] = {}
    for pid in ours:
        try:
            name = "benchmark + simulated kubelets" if pid == os.getpid() else _label(pid)
            totals[name] = totals.get(name, 0.0) + cpu_seconds(pid)
        except OSError:
            continue
    return totals


async def idle_cpu(seconds: float) -> dict[str, float]:
    """Each program's CPU (ms per second) while no burst runs: a burst's CPU includes this for as
    long as it lasts, so a longer burst counts more of it per pod."""
    before = cpu_by_process()
    await asyncio.sleep(seconds)
    return {name: (used - before.get(name, 0.0)) / seconds * 1000 for name, used in cpu_by_process().items()}


async def run(args: argparse.Namespace) -> int:
    fleet = load_fleet(str(h100_fleet(Path(tempfile.mkdtemp(prefix="gl-bench-")), args.nodes)))
    async with running_stack(
        fleet, free_port(), free_port(), lambda m: print(f"[stack] {m}", flush=True), "real"
    ) as stack:
        cluster = stack.cluster
        assert isinstance(cluster, RealCluster) and cluster.api is not None
        api = cluster.api
        await api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        for node in cluster.nodes:  # the plain resource, as another device plugin would advertise it
            await api.patch(
                f"/api/v1/nodes/{node}/status",
                {"status": {"capacity": {PLAIN: "8"}, "allocatable": {PLAIN: "8"}}},
                STRATEGIC,
            )
        await asyncio.to_thread(
            cluster.control_plane.start_scheduler, "plain-scheduler", plain_scheduler_config("plain-scheduler")
        )
        metrics_url = f"{stack.placement_ops}/metrics"
        placement = stack.supervisor.get("placement").process
        assert placement is not None
        rows: dict[str, list[float]] = {"plain": [], "gpuledger": []}
        refused: list[float] = []
        writes: list[int] = []  # ledger writes while a gpuledger burst binds
        cpu_per_pod: list[float] = []
        breakdown: dict[str, dict[str, list[float]]] = {"plain": {}, "gpuledger": {}}
        wholes: dict[str, list[float]] = {"plain": [], "gpuledger": []}
        nets: dict[str, list[float]] = {"plain": [], "gpuledger": []}  # less what the idle stack uses meanwhile
        mean_ms: dict[str, list[float]] = {"filter": [], "bind": []}
        await asyncio.sleep(2.0)  # the plain scheduler's start settles
        idle = await idle_cpu(3.0)
        for round_no in range(args.rounds):
            for kind in ("plain", "gpuledger"):
                failed_before = await metric(metrics_url, "gpuledger_placement_failures_total", 'verb="bind"')
                timed_before = {v: await timed(metrics_url, v) for v in mean_ms}
                sequence_before = await ledger_sequence(stack)
                cpu_before = cpu_seconds(placement.pid)
                all_before = cpu_by_process()
                for kubelet in cluster.kubelets.values():
                    if args.admit_during_bursts:
                        kubelet.resume_admissions()
                    else:
                        kubelet.hold_admissions()
                seconds = await burst(api, kind, args.pods, round_no)
                sequence_after = await ledger_sequence(stack)  # before admission writes its commits
                for kubelet in cluster.kubelets.values():
                    kubelet.resume_admissions()
                cpu_after = cpu_seconds(placement.pid)
                whole = 0.0
                for name, used in cpu_by_process().items():
                    per_pod = (used - all_before.get(name, 0.0)) / args.pods * 1000
                    breakdown[kind].setdefault(name, []).append(per_pod)
                    whole += per_pod
                wholes[kind].append(whole)
                nets[kind].append(whole - sum(idle.values()) * seconds / args.pods)
                rows[kind].append(args.pods / seconds)
                if kind == "gpuledger":
                    refused.append(
                        await metric(metrics_url, "gpuledger_placement_failures_total", 'verb="bind"') - failed_before
                    )
                    cpu_per_pod.append((cpu_after - cpu_before) / args.pods * 1000)
                    writes.append(sequence_after - sequence_before)
                    for verb, (seconds_before, calls_before) in timed_before.items():
                        seconds_after, calls_after = await timed(metrics_url, verb)
                        calls = calls_after - calls_before
                        mean_ms[verb].append((seconds_after - seconds_before) / calls * 1000 if calls else 0.0)
                print(
                    f"round {round_no} {kind:9s}: {args.pods} pods bound in {seconds:.2f} s "
                    f"({args.pods / seconds:.1f} pods/s)",
                    flush=True,
                )
                await clear(api, kind)
            await wait_for(lambda: ledger_empty(stack), 120, "every card back in the ledger", interval=0.5)
    plain, ours = statistics.median(rows["plain"]), statistics.median(rows["gpuledger"])
    print()
    print(f"| path | pods/s (median of {args.rounds}) | runs |")
    print("|---|---|---|")
    print(f"| plain extended resource, no extender | {plain:.1f} | {', '.join(f'{r:.1f}' for r in rows['plain'])} |")
    print(f"| gpuledger extender (filter + bind) | {ours:.1f} | {', '.join(f'{r:.1f}' for r in rows['gpuledger'])} |")
    print(f"ratio gpuledger / plain: {ours / plain:.2f}")
    print(f"binds refused per {args.pods} pods: {', '.join(f'{r:.0f}' for r in refused)}")
    print(f"ledger writes while {args.pods} pods were bound: {', '.join(str(w) for w in writes)}")
    print(f"placement CPU per pod (ms, filter + bind + ledger watch): {', '.join(f'{c:.2f}' for c in cpu_per_pod)}")
    for verb, values in mean_ms.items():
        print(f"mean {verb} time inside placement (ms, from its histogram): {', '.join(f'{v:.2f}' for v in values)}")
    print()
    print("CPU per pod while a burst binds (ms, median over rounds), by process:")
    print("| process | plain | gpuledger | idle (ms per second) |")
    print("|---|---|---|---|")
    names = sorted(set(breakdown["plain"]) | set(breakdown["gpuledger"]))
    for name in sorted(names, key=lambda n: -statistics.median(breakdown["gpuledger"].get(n, [0.0]))):
        cells = [f"{statistics.median(breakdown[k][name]):.2f}" if name in breakdown[k] else "-" for k in breakdown]
        print(f"| {name} | {' | '.join(cells)} | {idle.get(name, 0.0):.1f} |")
    # Where the machine is saturated in both bursts, pods/s follow its CPU per pod: the ratio of the
    # whole stack's CPU per pod is the one pods/s show on a machine nothing else loads (other work on
    # it slows the short plain bursts most), and it moves less from run to run.
    machine = {kind: statistics.median(values) for kind, values in wholes.items()}
    net = {kind: statistics.median(values) for kind, values in nets.items()}
    print(
        f"| whole machine (median of the rounds' sums) | {machine['plain']:.2f} | {machine['gpuledger']:.2f} "
        f"| {sum(idle.values()):.1f} |"
    )
    print(f"| whole machine less its idle use over the burst | {net['plain']:.2f} | {net['gpuledger']:.2f} | |")
    print(f"CPU per pod, plain / gpuledger: {machine['plain'] / machine['gpuledger']:.2f} (idle use left out: ", end="")
    print(f"{net['plain'] / net['gpuledger']:.2f})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=13)
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--admit-during-bursts",
        action="store_true",
        help="let the simulated kubelets admit pods (Allocate through the plugin shims) while binds are "
        "measured; by default admission waits until each burst is bound, since on a cluster it runs on the "
        "nodes, not on the control plane's cores",
    )
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
