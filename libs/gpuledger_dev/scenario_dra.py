"""The demo scenario in DRA mode (``gpuledger dev up --kubernetes real --mode dra``), checked as it runs.

The same story as the classic demo (``scenario.py``), told through ResourceClaims of the
DeviceClass ``gpu.gpuledger.io``: shares of the RTX 3090 by memory (units of 256 MiB, the slices'
memory step) with 1 % of compute each, the two Tesla P4 with 4, 20 and 20 units, a 4-card claim
on the H100 node whose cards must share an NVLink group (``matchAttribute``), and the card that
turns unhealthy (tainted in the slice: never allocated again). Every pod goes the whole way:
kube-scheduler allocates its claim from the slices, the claims controller reserves exactly that in
the ledger and marks it committed, the pod is bound, the node's kubelet has the DRA plugin prepare
the claim, and the container's environment is that of the claim's CDI spec. Then MIG instances
through claims of the class ``mig.gpu.gpuledger.io`` (``scenario_mig``).
"""

from __future__ import annotations

from typing import Any

from gpuledger_dev.fake_cluster import Outcome
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import DRIVER, NAMESPACE, RealCluster
from gpuledger_dev.scenario import (
    UNIT_MIB,
    Checks,
    Say,
    card_indexes,
    describe,
    fleet_node,
    released_reason,
    wait_unhealthy,
)
from gpuledger_dev.scenario_mig import NODE as MIG_NODE
from gpuledger_dev.scenario_mig import mig_request, run_mig

CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"


def share(n: int) -> dict[str, Any]:
    """A request for ``n`` units of memory and 1 % of compute of one card."""
    capacity = {"requests": {"memory": f"{n * UNIT_MIB}Mi", "compute": "1"}}
    return {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "capacity": capacity}}


def cards(n: int, linked: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A request for ``n`` whole cards; ``linked``: all in one NVLink group of four."""
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": n}}
    constraints = [{"requests": ["gpu"], "matchAttribute": f"{DRIVER}/nvlinkGroup4"}] if linked else []
    return request, constraints


async def run_dra_scenario(stack: Stack, say: Say) -> bool:
    cluster = stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.dra
    checks = Checks(say)
    await _rtx(stack, cluster, checks)
    await _p4(cluster, checks)
    await _h100(stack, cluster, checks)
    await _mig(stack, cluster, checks)
    return not checks.failed


async def claim_and_run(
    cluster: RealCluster, name: str, request: dict[str, Any], node: str, constraints: list[dict[str, Any]] | None = None
) -> Outcome:
    """The claim ``name`` and a pod using it, kept to ``node``; until the pod runs or is refused."""
    assert cluster.api is not None
    devices: dict[str, Any] = {"requests": [request]}
    if constraints:
        devices["constraints"] = constraints
    await cluster.api.create(CLAIMS, {"metadata": {"name": name}, "spec": {"devices": devices}})
    pod = {
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "gpuledger-scheduler",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": "gpuledger.io/gpu-node", "operator": "Exists", "effect": "NoSchedule"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [{"name": "app", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    return await cluster.run(pod, [node])


async def _rtx(stack: Stack, cluster: RealCluster, checks: Checks) -> None:
    card = next(c.uuid for c in fleet_node(stack, "rtx-0").cards if c.index == 0)
    apps = (("app-a", 50), ("app-b", 40), ("app-c", 1))
    placed = [await claim_and_run(cluster, name, share(n), "rtx-0") for name, n in apps]
    for o, (_, n) in zip(placed, apps, strict=True):
        env = o.env.get("app", {})
        ok = not o.pending and env.get("CUDA_VISIBLE_DEVICES") == card
        ok = ok and env.get("GPULEDGER_MEMORY_LIMIT_MIB") == str(n * UNIT_MIB)
        checks.check(ok, describe(o), f"{o.pod}: {o.pending or o.env}")
    await _delete(stack, cluster, checks, "app-c")
    bigger = await claim_and_run(cluster, "app-c-10", share(10), "rtx-0")
    checks.check(
        bool(bigger.pending) and "claim" in bigger.pending,
        f"app-c raised to 10 units stays pending: {bigger.pending}",
        f"app-c with 10 units: {bigger}",
    )


async def _p4(cluster: RealCluster, checks: Checks) -> None:
    got = [await claim_and_run(cluster, f"p4-{n}u-{i}", share(n), "p4-0") for i, n in enumerate((4, 20, 20))]
    given = [o.env.get("app", {}).get("CUDA_VISIBLE_DEVICES", "") for o in got]
    ok = all(not o.pending for o in got) and sorted(given.count(c) for c in set(given)) == [1, 2]
    for o in got:
        checks.say(f"     {describe(o)}")
    checks.check(ok, "p4-0: 4, 20 and 20 units land as two on one card and one on the other", f"p4-0: {got}")


async def _h100(stack: Stack, cluster: RealCluster, checks: Checks) -> None:
    node = fleet_node(stack, "h100-0")
    request, linked = cards(4, linked=True)
    job = await claim_and_run(cluster, "train-4", request, "h100-0", linked)
    chosen = card_indexes(node, job)
    connected = all(node.link(a, b).nvlinks > 0 for a in chosen for b in chosen if a < b)
    checks.check(
        len(chosen) == 4 and connected,
        f"h100-0: the 4-card claim got cards {chosen}, every pair on NVLink (matchAttribute nvlinkGroup4)",
        f"h100-0: the 4-card claim got {chosen} ({job.pending})",
    )
    sick = await wait_unhealthy(stack, "h100-0")
    if not checks.check(sick is not None, f"h100-0: card {sick} turned unhealthy (XID)", "no card turned unhealthy"):
        return
    free = [c.index for c in node.cards if c.index not in chosen and c.index != sick]
    too_many = await claim_and_run(cluster, "after-fault-big", cards(len(free) + 1)[0], "h100-0")
    checks.check(bool(too_many.pending), f"a {len(free) + 1}-card claim now waits: {too_many.pending}", f"{too_many}")
    fits = await claim_and_run(cluster, "after-fault", cards(len(free))[0], "h100-0")
    got = card_indexes(node, fits)
    checks.check(got == sorted(free), f"a {len(free)}-card claim gets {got}, never the tainted card {sick}", f"{fits}")


async def _mig(stack: Stack, cluster: RealCluster, checks: Checks) -> None:
    """The MIG step (``scenario_mig``) through claims of the class ``mig.gpu.gpuledger.io``."""

    async def run(name: str, sized: dict[str, Any] | None, profile: str) -> Outcome:
        request = mig_request(profile, None if sized is None else int(sized["memory"]))
        return await claim_and_run(cluster, name, request, MIG_NODE)

    async def card() -> Outcome:
        return await claim_and_run(cluster, "a100-whole", cards(1)[0], MIG_NODE)

    await run_mig(stack, checks, run, card)


async def _delete(stack: Stack, cluster: RealCluster, checks: Checks, name: str) -> None:
    """Delete the pod and its claim; the claims controller releases the claim's ledger entry."""
    assert cluster.api is not None
    uid = str((await cluster.api.get(f"{CLAIMS}/{name}"))["metadata"]["uid"])
    await cluster.delete(NAMESPACE, name)
    await cluster.api.delete(f"{CLAIMS}/{name}")
    reason = await released_reason(stack, "claim", uid)
    checks.check(bool(reason), f"{name} deleted: its claim's cards released ({reason})", f"{name} deleted, still held")
