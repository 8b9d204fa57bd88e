"""How long the real kubelet's admission of a GPU pod takes when the ledger cannot be reached.

    python -m benchmarks.real_node_outage [--rounds 3]     # as root; builds the real node on first use

The stack runs on the real control plane with one real node (kubelet and containerd). Each round:
kubelet is paused (SIGSTOP), a pod asking for a share of a card is created, kube-scheduler binds it
through the extender (the reservation is written to the ledger before the bind) and the node's
plugin sees the reservation; then nats-server is frozen (SIGSTOP, as a hung server or a partition
looks) and kubelet resumed. kubelet admits the pod: GetPreferredAllocation and Allocate go to the
plugin with no deadline. The round measures how long until the pod is Running, or Failed with
kubelet's reason, then thaws nats-server. Medians of the rounds are printed, with what kubelet
said. Each round also checks that the admitted pod is bound in the ledger once nats-server answers again.
The plugin waits for a ledger that answers nothing (a frozen server) ``unreachable_wait_s`` (3 s)
in each call, then answers from its copy of the node's ledger key; ``answer_timeout_s`` (30 s)
bounds every answer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from gpuledger_core.model import AllocState
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import RealCluster, reporting
from tests.support.ledger_check import read_ledger

FLEET = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "real_fleet.yaml"
REAL = "real-p4"
NAMESPACE = "outage"


def _say(message: str) -> None:
    print(f"[outage] {message}", flush=True)


def shares_pod(name: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [REAL]}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    return {
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "gpuledger-scheduler",
            "terminationGracePeriodSeconds": 0,
            "affinity": {"nodeAffinity": required},
            "containers": [
                {
                    "name": "app",
                    "image": "cuda",
                    "resources": {"limits": {"gpuledger.io/gpu": "1", "gpuledger.io/gpu-mem": "512"}},
                }
            ],
        },
    }


async def one_round(stack: Stack, index: int) -> tuple[float, str]:
    cluster = stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.api is not None and cluster.real is not None
    kubelet = cluster.real.processes["kubelet"].popen
    nats = stack.nats.process
    assert kubelet is not None and nats is not None
    name = f"round-{index}"
    os.kill(kubelet.pid, signal.SIGSTOP)
    try:
        body = shares_pod(name)
        body["spec"] = reporting(body["spec"])
        await cluster.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", body)
        deadline = time.monotonic() + 60
        while not (await cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"))["spec"].get("nodeName"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} was not bound within 60 s")
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # the plugin's watch brings the reservation
        os.kill(nats.pid, signal.SIGSTOP)
    finally:
        os.kill(kubelet.pid, signal.SIGCONT)
    started = time.monotonic()
    try:
        while True:
            pod = await cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
            phase = pod.get("status", {}).get("phase")
            if phase in ("Running", "Failed"):
                took = time.monotonic() - started
                said = pod["status"].get("message", "") if phase == "Failed" else "admitted"
                return took, f"{phase}: {said}"
            if time.monotonic() - started > 120:
                return time.monotonic() - started, "neither Running nor Failed after 120 s"
            await asyncio.sleep(0.1)
    finally:
        os.kill(nats.pid, signal.SIGCONT)
        try:
            await bound_after_the_outage(stack, name)
        finally:
            await cluster.delete(NAMESPACE, name)


async def bound_after_the_outage(stack: Stack, name: str, within: float = 60) -> None:
    """The pod admitted during the outage is bound in the ledger once nats-server answers again."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = [a for a in (await read_ledger(stack.nats_url, stack.operator))[REAL].live() if a.owner.name == name]
        if found and all(a.state is AllocState.BOUND for a in found):
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{name} was not bound in the ledger within {within:g} s of the outage's end")


async def main_async(rounds: int) -> None:
    fleet = load_fleet(FLEET)
    async with running_stack(fleet, free_port(), free_port(), _say, "real", real_node=REAL) as stack:
        cluster = stack.cluster
        assert isinstance(cluster, RealCluster) and cluster.api is not None
        await cluster.api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        results = []
        for index in range(rounds):
            took, said = await one_round(stack, index)
            results.append(took)
            print(f"round {index}: admission took {took:.1f} s with nats-server frozen; {said}", flush=True)
            await asyncio.sleep(5)  # the ledger back, the allocator releases what the round left
        print(f"median admission with the ledger unreachable: {statistics.median(results):.1f} s over {rounds}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main_async(parser.parse_args().rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
