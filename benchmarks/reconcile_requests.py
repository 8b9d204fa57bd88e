"""What the allocator's reconciliation asks of a real kube-apiserver with many pods: the periodic
full listing of every pod (what each replica did before: ``GET /api/v1/pods`` in pages of 500,
every ``reconcile_interval_s``) next to the list-then-watch of gpuledger's pods it does now
(``PodCache``: one listing, then a watch), same run, same API server.

A real control plane (etcd, kube-apiserver, kube-controller-manager, kwok; no scheduler, so the pods
stay Pending), ``--pods`` pods of gpuledger's scheduler and as many of another one, and a steady
churn of ``--churn`` pod deletions and creations per second while each way is measured for
``--window`` seconds. From the API server's own metrics: requests per minute (by verb) and bytes of
list responses per minute; from /proc: the API server's CPU seconds per minute.

    python -m benchmarks.reconcile_requests [--pods 5000] [--window 60] [--interval 30] [--churn 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from gpuledger_allocator.kube import OURS, KubePodLister
from gpuledger_allocator.podcache import PodCache
from gpuledger_common.kubeconfig import from_file
from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.controlplane.cluster import ControlPlane
from tests.support.benchpods import cpu_seconds

NAMESPACE = "reconcile-bench"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def pod(name: str, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "app", "image": "cuda"}]},
    }


def api_cpu_s(control_plane: ControlPlane) -> float:
    popen = control_plane.processes["kube-apiserver"].popen
    assert popen is not None
    return cpu_seconds(popen.pid)


async def api_metrics(control_plane: ControlPlane) -> tuple[dict[str, float], float]:
    """Pod requests so far by verb, and bytes of pod list responses so far."""
    text = (await asyncio.to_thread(control_plane.kubectl, "get", "--raw", "/metrics")).stdout
    requests: dict[str, float] = {}
    list_bytes = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="pods"' in line and 'subresource=""' in line:
            verb = re.search(r'verb="(\w+)"', line)
            name = verb.group(1) if verb else "?"
            requests[name] = requests.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("apiserver_response_sizes_sum{") and 'resource="pods"' in line and 'verb="LIST"' in line:
            list_bytes += float(line.rsplit(" ", 1)[1])
    return requests, list_bytes


async def churn(api: KubeApi, per_s: float, stop: asyncio.Event) -> None:
    """Delete one of our pods and create a new one, ``per_s`` times a second."""
    n = 0
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await api.call("DELETE", f"{PODS}/ours-{n}", params={"gracePeriodSeconds": "0"})
            await api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod(f"new-{n}", "gpuledger-scheduler"))
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1 / per_s)


Work = Callable[[], Coroutine[Any, Any, None]]


async def measured(api: KubeApi, cp: ControlPlane, window: float, per_s: float, work: Work) -> dict[str, float]:
    before, bytes_before, cpu_before = *(await api_metrics(cp)), api_cpu_s(cp)
    stop = asyncio.Event()
    started = time.monotonic()
    tasks = [asyncio.create_task(work()), asyncio.create_task(churn(api, per_s, stop))]
    await asyncio.sleep(window)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    minutes = (time.monotonic() - started) / 60
    after, bytes_after, cpu_after = *(await api_metrics(cp)), api_cpu_s(cp)
    # The churn's own DELETE and POST are the same in both ways; count what reconciliation asks.
    return {
        "LIST/min": (after.get("LIST", 0.0) - before.get("LIST", 0.0)) / minutes,
        "WATCH/min": (after.get("WATCH", 0.0) - before.get("WATCH", 0.0)) / minutes,
        "GET/min": (after.get("GET", 0.0) - before.get("GET", 0.0)) / minutes,
        "list MB/min": (bytes_after - bytes_before) / minutes / 1e6,
        "apiserver CPU s/min": (cpu_after - cpu_before) / minutes,
    }


async def run(args: argparse.Namespace) -> int:
    with ControlPlane(Path(tempfile.mkdtemp(prefix="gl-cp-"))) as control_plane:
        assert control_plane.access is not None
        kubeconfig = control_plane.access.kubeconfig(Path(tempfile.mkdtemp(prefix="gl-rb-")) / "kubeconfig")
        async with KubeApi(control_plane.access) as api:
            await api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            sem = asyncio.Semaphore(32)

            async def create(body: dict[str, Any]) -> None:
                async with sem:
                    await api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)

            started = time.monotonic()
            bodies = [pod(f"ours-{i}", "gpuledger-scheduler") for i in range(args.pods)]
            bodies += [pod(f"theirs-{i}", "default-scheduler") for i in range(args.pods)]
            await asyncio.gather(*(create(b) for b in bodies))
            print(f"{len(bodies)} pods created in {time.monotonic() - started:.0f} s", flush=True)

            everything = KubePodLister(await from_file(str(kubeconfig)), field_selector="")

            async def listing_every_interval() -> None:
                while True:
                    await everything.list_pods()
                    await asyncio.sleep(args.interval)

            ours = KubePodLister(await from_file(str(kubeconfig)), field_selector=OURS)
            cache = PodCache(ours)

            async def watching() -> None:  # the cache's own task goes on; this one only waits
                await asyncio.Event().wait()

            try:
                rows = {
                    f"full listing every {args.interval:g} s (before)": await measured(
                        api, control_plane, args.window, args.churn, listing_every_interval
                    )
                }
                first, first_bytes = await api_metrics(control_plane)
                following = asyncio.create_task(cache.run())
                while not cache.synced:
                    await asyncio.sleep(0.1)
                then, then_bytes = await api_metrics(control_plane)
                initial = then.get("LIST", 0.0) - first.get("LIST", 0.0), (then_bytes - first_bytes) / 1e6
                rows["list once, then watch our pods (now, after its listing)"] = await measured(
                    api, control_plane, args.window, args.churn, watching
                )
                following.cancel()
            finally:
                await everything.close()
                await ours.close()
            followed = sum(1 for p in cache.pods.values() if p.namespace == NAMESPACE)
    columns = list(next(iter(rows.values())))
    print()
    print(f"{2 * args.pods} pods ({args.pods} of gpuledger's scheduler), {args.churn:g} deletions + creations/s, "
          f"{args.window:g} s per way")  # fmt: skip
    print("| reconciliation | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in columns) + " |")
    print(f"the watch's one listing (at start, after a 410 or a broken watch, and every 10 min): "
          f"{initial[0]:.0f} LIST requests, {initial[1]:.2f} MB")  # fmt: skip
    print(f"pods in the watch's cache at the end: {followed} (every pod of gpuledger's scheduler)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--churn", type=float, default=2.0)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
