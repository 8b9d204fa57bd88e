"""A failed card repaired alone (gpuledger's remediation) against the whole node taken out for it.

    python -m benchmarks.remediation [--rounds 3] [--repair-min 10] [--lost-work-min 30]

The stack runs on the real control plane (kube-apiserver, kube-scheduler with the extender,
kube-controller-manager's ReplicaSet controller, kwok nodes with simulated kubelets), with two
nodes of eight A100 80 GB cards. Each round places a ReplicaSet of 12 pods of 40000 MiB (two to a
card) on those nodes, then injects XID 79 ("fallen off the bus") into the fake NVML of the card
holding the most of them, and measures from that moment:

- ``card``: gpuledger. The node's inventory runs with ``--remediate``: placement evicts the pods on
  that card alone, the inventory resets the card once no one holds it (the fake NVML's reset: half a
  second), checks it and returns it. The other seven cards keep their pods and take new ones.
- ``node``: node-level remediation, emulated. The node's inventory does not remediate (the card
  only turns unhealthy). As soon as the card shows unhealthy in the ledger, the benchmark does what
  a node remediator does: cordons the Node, evicts every pod on it through the Eviction API, waits
  until the node holds nothing, repairs (the same half second, then an operator's heal of the card,
  standing in for the node's reboot) and uncordons it. All eight cards are out of service meanwhile.

Measured: fault to drained (no holder on the card, or on the node), fault to back in service
(MTTR: the card serving again, or the node uncordoned), fault to the ReplicaSet whole and running
again, the pods evicted. GPU-hours lost per fault are then a model, stated in the output: the cards
out of service for (fault to drained + ``--repair-min``), plus each evicted pod's share of a card
for (``--lost-work-min`` of work since its last checkpoint + its measured time to run again).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuledger_core.model import Health, Remedy
from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import RealCluster
from gpuledger_inventory.remediation import Stage
from tests.support.card_repair import LedgerSampler, Read, holders_by_card, in_stack, ledger_reader

NODES = ("a100-0", "a100-1")
CARDS, CARD_MIB = 8, 81920
REPLICAS, SHARE_MIB = 12, 40000
POLL_S = 0.1
ROUND_S = 300.0
FAKE_RESET_S = 0.5  # the fake NVML's reset of a card without a script (docs/fleet-file.md)


def _say(message: str) -> None:
    print(f"[remediation] {message}", flush=True)


@dataclass(frozen=True, slots=True)
class Round:
    mode: str
    drained_s: float
    back_s: float
    running_s: float  # the ReplicaSet whole and running again
    cards_out: int
    evicted: int


async def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """What ``check`` (a function or a coroutine function) returns once it is truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        found = await found if inspect.isawaitable(found) else found
        if found:
            return found
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"{what}: not within {timeout:g} s")


def replica_set() -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(NODES)}]}
    limits = {"gpuledger.io/gpu": "1", "gpuledger.io/gpu-mem": str(SHARE_MIB)}
    spec = {
        "schedulerName": "gpuledger-scheduler",
        "terminationGracePeriodSeconds": 1,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}},
        "containers": [{"name": "app", "image": "cuda", "resources": {"limits": limits}}],
    }
    template = {"metadata": {"labels": {"app": "work"}}, "spec": spec}
    return {
        "metadata": {"name": "work"},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": "work"}}, "template": template},
    }


def whole(api: KubeApi, ns: str) -> Callable[[], Awaitable[list[dict[str, Any]] | None]]:
    """The ReplicaSet's pods once all of them run and no other is left."""

    async def check() -> list[dict[str, Any]] | None:
        pods = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
        running = [
            p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        return running if len(running) == len(pods) == REPLICAS else None

    return check


async def rerun(api: KubeApi, ns: str, moved: set[str]) -> tuple[int, float]:
    """How many pods the remediation moves (``moved``: their uids), and when none of them is left
    and the ReplicaSet is whole and running again."""

    async def check() -> list[dict[str, Any]] | None:
        found = await whole(api, ns)()
        return found if found is not None and not moved & {p["metadata"]["uid"] for p in found} else None

    await until(check, 180, "the ReplicaSet whole again")
    return len(moved), time.time()


async def target(read: Read, uids: set[str]) -> tuple[str, int, set[str], set[str]]:
    """The node and card holding the most of the pods ``uids``; the pods on the card, on the node."""
    found = [(len(held), n.node.name == NODES[0], -card, n.node.name, card, held, set().union(*cards.values()))
             for n in await read() if n.node.name in NODES
             for cards in [holders_by_card(n, uids)] for card, held in cards.items()]  # fmt: skip
    best = max(found, key=lambda f: f[:3])
    return best[3], best[4], best[5], best[6]


@contextlib.asynccontextmanager
async def workload(api: KubeApi, read: Read, ns: str) -> AsyncIterator[list[dict[str, Any]]]:
    await api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    try:
        await api.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", replica_set())
        yield await until(whole(api, ns), 180, "the ReplicaSet's pods running")
    finally:
        with contextlib.suppress(ApiError):
            await api.delete(f"/apis/apps/v1/namespaces/{ns}/replicasets/work")
            await api.call("DELETE", f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": "0"})
            await api.delete(f"/api/v1/namespaces/{ns}")

        async def released() -> bool:
            return not any(a.owner.namespace == ns for n in await read() for a in n.live())

        await until(released, 120, f"every card held in {ns} released")


async def card_round(stack: Stack, api: KubeApi, read: Read, index: int) -> Round:
    ns = f"card-{index}"
    async with workload(api, read, ns) as pods:
        node, card, moved, _ = await target(read, {p["metadata"]["uid"] for p in pods})
        async with in_stack(stack, node, "--remediate", "--retire-window-s", "0") as repairing:
            fault = await repairing.fail(card)
            back, (evicted, again) = await asyncio.gather(
                repairing.reached(card, Stage.SERVING, fault, 180), rerun(api, ns, moved)
            )
            drained = repairing.stage_at(card, Stage.DRAINED, fault)
            assert drained is not None
            return Round("card", drained - fault, back - fault, again - fault, 1, evicted)


async def node_round(stack: Stack, api: KubeApi, read: Read, index: int) -> Round:
    ns = f"node-{index}"
    async with workload(api, read, ns) as pods:
        node, card, _, moved = await target(read, {p["metadata"]["uid"] for p in pods})
        async with in_stack(stack, node) as plain:
            sampler = LedgerSampler(read, node, card, interval=POLL_S)
            async with sampler.running():
                fault = await plain.fail(card)
                await until(lambda: sampler.first(fault, Remedy.NONE, Health.UNHEALTHY), 60, "the card unhealthy")

                async def repaired() -> tuple[float, float]:
                    drained = await _drain_node(api, read, node)
                    await asyncio.sleep(FAKE_RESET_S)  # the same repair as the card's: the fake's reset
                    await plain.heal(card, "node-level remediation: the node was repaired")
                    await api.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": False}})
                    return drained, time.time()

                (drained, back), (evicted, again) = await asyncio.gather(repaired(), rerun(api, ns, moved))
                return Round("node", drained - fault, back - fault, again - fault, CARDS, evicted)


async def _drain_node(api: KubeApi, read: Read, node: str) -> float:
    """Cordon the node and evict every pod on it (as a node remediator does); when it held nothing."""
    await api.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})
    pods = (await api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}"))["items"]
    for pod in pods:
        meta = pod["metadata"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        }
        await api.create(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction", body)

    async def empty() -> float | None:
        found = next(n for n in await read() if n.node.name == node)
        return time.time() if not list(found.live()) else None

    return float(await until(empty, 120, f"{node} holding nothing"))


@dataclass(frozen=True, slots=True)
class Model:
    repair_min: float
    lost_work_min: float

    def gpu_hours(self, r: Round) -> tuple[float, float]:
        """Card-hours out of service, and card-hours of the evicted pods' work."""
        out = r.cards_out * (r.drained_s + self.repair_min * 60) / 3600
        work = r.evicted * SHARE_MIB / CARD_MIB * (self.lost_work_min * 60 + r.running_s) / 3600
        return out, work


def report(rounds: list[Round], model: Model) -> None:
    share = f"{SHARE_MIB}/{CARD_MIB} MiB of a card"
    print(f"\nmodel: a repair takes {model.repair_min:g} min for either (a card's reset and check; the node's "
          f"repair); an evicted pod loses {model.lost_work_min:g} min of work on {share}")  # fmt: skip
    print(
        "| remediation | rounds | fault to drained | fault to back (MTTR, measured) | fault to all running again "
        "| cards out | pods evicted | card-h out | card-h of evicted work | GPU-hours lost |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    totals = {}
    for mode in ("card", "node"):
        mine = [r for r in rounds if r.mode == mode]
        if not mine:
            continue
        med = {
            k: statistics.median(getattr(r, k) for r in mine) for k in ("drained_s", "back_s", "running_s", "evicted")
        }
        out = statistics.median(model.gpu_hours(r)[0] for r in mine)
        work = statistics.median(model.gpu_hours(r)[1] for r in mine)
        totals[mode] = statistics.median(sum(model.gpu_hours(r)) for r in mine)
        times = f"{med['drained_s']:.1f} s | {med['back_s']:.1f} s | {med['running_s']:.1f} s"
        lost = f"{out:.2f} | {work:.2f} | {totals[mode]:.2f}"
        print(f"| {mode} | {len(mine)} | {times} | {mine[0].cards_out} | {med['evicted']:g} | {lost} |")
    for r in rounds:
        print(f"  {r}")
    if len(totals) == 2:
        print(f"\nGPU-hours lost, node-level / card-granular: {totals['node'] / totals['card']:.1f}x")


async def bounded(work: Awaitable[Round], seconds: float) -> Round:
    """``work``, cut off after ``seconds`` with every task's stack printed (where it waited)."""
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        for task in asyncio.all_tasks():
            task.print_stack(limit=8)
        raise


def fleet_file() -> Path:
    path = Path(tempfile.mkdtemp(prefix="gl-remediation-")) / "fleet.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": n, "profile": "a100-sxm-8"} for n in NODES]}))
    return path


async def main_async(rounds: int, model: Model) -> None:
    fleet = load_fleet(str(fleet_file()))
    async with running_stack(fleet, free_port(), free_port(), _say, "real") as stack:
        cluster = stack.cluster
        assert isinstance(cluster, RealCluster) and cluster.api is not None
        results: list[Round] = []
        async with ledger_reader(stack.nats_url, stack.operator) as read:
            for index in range(rounds):
                for run in (card_round, node_round):
                    found = await bounded(run(stack, cluster.api, read, index), ROUND_S)
                    _say(str(found))
                    results.append(found)
        report(results, model)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repair-min", type=float, default=10.0, help="a repair's duration in the model")
    parser.add_argument("--lost-work-min", type=float, default=30.0, help="work an evicted pod loses in the model")
    args = parser.parse_args()
    asyncio.run(main_async(args.rounds, Model(args.repair_min, args.lost_work_min)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
