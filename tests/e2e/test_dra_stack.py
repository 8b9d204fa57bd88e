"""The stack in DRA mode (`gpuledger dev up --kubernetes real --mode dra`), on its own real control
plane, with every node in classic mode as well (the device plugin shim beside the DRA plugin, the
`both` mode of the benchmarks): every node's inventory publishes ResourceSlices, every claim is allocated by the real
kube-scheduler and committed by the ledger, every pod runs only after the node's DRA plugin
prepared its claim (the kwok kubelet's DRA side), and its container's environment is the claim's
CDI spec.

- The demo scenario; afterwards the ledger holds only claims, each exactly as its ResourceClaim was
  allocated.
- Faults in the middle of a burst of claims: SIGKILL of placement (the claims controller), of the
  allocator and of nats-server (each restarted), and a restart of a node's kubelet. Afterwards
  every pod runs or is unbound with the scheduler's reason, no card is over capacity, and the
  ledger's claim entries are exactly the claims' allocations.
- The same in mode C (a namespace labelled for the ledger's allocation): a burst of 200 claims with
  a second placement replica racing the first, and the burst with placement or nats-server killed
  in its middle. Afterwards no card is over capacity, every claim the ledger
  allocated once, every bound pod's claim allocated by the ledger (none by kube-scheduler while
  placement was down), every pod running or gated with gpuledger's reason, and the ledger's
  entries exactly the allocations.
- Classic pods, mode-B claims and mode-C claims at once on the same nodes and cards: no card over
  capacity, the ledger equal to the classic pods and to the claims."""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpuledger_core.dra_mig import device_name
from gpuledger_core.model import CardShare, OwnerKind
from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.fleet import Fleet, load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import BOTH, DRIVER, NAMESPACE, RealCluster
from gpuledger_dev.scenario_dra import CLAIMS, run_dra_scenario
from gpuledger_dev.up import DEFAULT_FLEET as DEV_FLEET
from gpuledger_placement.claim_allocator import FINALIZER
from gpuledger_placement.claims import WRITING_S
from tests.e2e.dra_ledger import COMMITTED, REJECTED, conditions
from tests.e2e.helpers import consistent, ledger, pod, share, steady
from tests.support.ledger_check import check
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def dra_stack() -> AsyncIterator[Stack]:
    fleet: Fleet = load_fleet(str(DEV_FLEET))
    async with running_stack(fleet, free_port(), free_port(), _say, "real", mode=BOTH) as running:
        yield running


def _say(message: str) -> None:
    print(f"[e2e dra stack] {message}", flush=True)


@pytest.mark.timeout(420)
async def test_the_demo_scenario_in_dra_mode(dra_stack: Stack) -> None:
    try:
        await _demo(dra_stack)
    finally:  # the demo's pods and claims go: the fault tests find the cards free
        await _delete_all(dra_stack, NAMESPACE)


async def _demo(dra_stack: Stack) -> None:
    said: list[str] = []
    assert await run_dra_scenario(dra_stack, said.append), "\n".join(said)
    assert any("stays pending" in line for line in said), said
    assert any("mig-4g on a100-mig-0: 4g.20gb@" in line for line in said), said  # the MIG step ran, by claims
    cluster = dra_stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.api is not None
    claims = (await cluster.api.get(CLAIMS))["items"]
    allocated = {c["metadata"]["uid"]: c for c in claims if c.get("status", {}).get("allocation")}
    # the stack's namespace is mode C's (dev up's default): the ledger allocated every claim itself
    assert allocated and all("gpuledger.io/allocation" in c["metadata"]["finalizers"] for c in allocated.values())
    held = {a.owner.id: (node, a) for node, found in (await ledger(dra_stack)).items() for a in found.live()}
    assert {owner: node for owner, (node, _) in held.items()} == {
        uid: c["status"]["allocation"]["devices"]["results"][0]["pool"] for uid, c in allocated.items()
    }
    assert all(a.owner.kind is OwnerKind.CLAIM and a.owner.namespace == NAMESPACE for _, a in held.values())
    for uid, (_, entry) in held.items():
        results = allocated[uid]["status"]["allocation"]["devices"]["results"]
        assert sorted(map(device_of, entry.shares())) == sorted(r["device"] for r in results)


def device_of(share: CardShare) -> str:
    """The slice's device a ledger share is: the card, or the MIG placement on it."""
    if share.mig is None:
        return f"gpu-{share.index}"
    return device_name(share.index, share.mig.profile, share.mig.start)


def _finalized(api: KubeApi, path: str) -> Callable[[], Awaitable[list[dict[str, Any]] | None]]:
    """The claims once every allocated one carries gpuledger's finalizer."""

    async def check() -> list[dict[str, Any]] | None:
        claims: list[dict[str, Any]] = (await api.get(path))["items"]
        allocated = [c for c in claims if c.get("status", {}).get("allocation")]
        return claims if all(FINALIZER in c["metadata"].get("finalizers", []) for c in allocated) else None

    return check


async def _delete_all(stack: Stack, ns: str) -> None:
    cluster = stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.api is not None
    await cluster.api.call("DELETE", f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": "0"})
    await cluster.api.call("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")

    async def left() -> list[str]:
        return [
            f"{node}: {a.owner.describe()} {a.id} {a.state.value} created {a.created_at:.1f} lease {a.lease_expires_at}"
            for node, found in (await ledger(stack)).items()
            for a in found.live()
            if a.owner.namespace == ns
        ]

    async def released() -> bool:
        return not await left()

    try:
        await wait_for(released, 180, f"every card held in namespace {ns} released", interval=0.5)
    except TimeoutError as err:
        claims = (await cluster.api.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"))["items"]
        told = [f"{c['metadata']['name']} {c['metadata']['uid']} {c['metadata'].get('finalizers')} "
                f"{c['metadata'].get('deletionTimestamp')} {bool(c.get('status', {}).get('allocation'))} "
                f"{c.get('status', {}).get('reservedFor')}" for c in claims]  # fmt: skip
        raise AssertionError("\n".join([str(err), f"at {time.time():.1f}", *await left(), "claims:", *told])) from None


async def kill_service(stack: Stack, name: str) -> None:
    await stack.supervisor.kill(name)
    await stack.supervisor.restart(name)


async def kill_nats(stack: Stack) -> None:
    await stack.nats.kill()
    await stack.nats.start()


async def restart_kubelet(stack: Stack) -> None:
    assert isinstance(stack.cluster, RealCluster)
    await stack.cluster.kubelets["h100-0"].restart()


FAULTS: dict[str, Callable[[Stack], Awaitable[None]]] = {
    "placement-sigkill": lambda stack: kill_service(stack, "placement"),
    "allocator-sigkill": lambda stack: kill_service(stack, "allocator"),
    "nats-server-sigkill": kill_nats,
    "kubelet-restart": restart_kubelet,
}
BURST = 48  # shares of 1 GiB and 1 %: 8 a card by slots; the fleet has 12 cards not in MIG mode, one turns unhealthy


@pytest.mark.timeout(420)
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_fault_mid_burst_of_claims_leaves_the_ledger_equal_to_the_claims(dra_stack: Stack, fault: str) -> None:
    cluster = dra_stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.api is not None
    api = cluster.api
    ns = f"dra-{fault}"
    await api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    try:
        claims_path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
        creating = asyncio.ensure_future(create_burst(api, ns, BURST))
        await wait_for(lambda: _bound_at_least(api, ns, BURST // 4), 120, f"{BURST // 4} pods bound", 0.2)
        await FAULTS[fault](dra_stack)
        await creating
        await wait_for(_steady(api, ns), 240, "every pod running, or unbound with a reason, for good", 1.0)
        dra_stack.supervisor.check()
        await wait_for(lambda: _decided(api, claims_path), 60, "every allocated claim committed or rejected", 0.5)
        claims = (await api.get(claims_path))["items"]
        found = await ledger(dra_stack)
        report = check(found.values(), [], 8, time.time())
        assert report.findings == [], report.findings
        committed = {
            c["metadata"]["uid"]: sorted(r["device"] for r in c["status"]["allocation"]["devices"]["results"])
            for c in claims
            if conditions(c).get(COMMITTED, {}).get("status") == "True"
        }
        held = {
            a.owner.id: sorted(f"gpu-{s.index}" for s in a.shares())
            for entries in found.values()
            for a in entries.live()
            if a.owner.kind is OwnerKind.CLAIM and a.owner.namespace == ns
        }
        assert held == committed
        running = sum(
            1
            for p in (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
            if p["status"].get("phase") == "Running"
        )
        print(f"\n  {fault}: {running} of {BURST} pods running, {len(held)} claims held", flush=True)
        assert running >= BURST * 3 // 4, f"only {running} of {BURST} pods run after {fault}"
    finally:
        await _delete_all(dra_stack, ns)
        await api.delete(f"/api/v1/namespaces/{ns}")


async def second_placement(stack: Stack) -> None:
    """A second placement replica beside the first (its own ports, the same ledger and cluster):
    both claim allocators race for every gated pod."""
    args = list(stack.supervisor.get("placement").args)
    for flag in ("--http-port", "--extender-port"):
        args[args.index(flag) + 1] = str(free_port())
    await stack.supervisor.start("placement-2", "gpuledger_placement", args)


MODE_C_FAULTS: dict[str, tuple[int, Callable[[Stack], Awaitable[None]]]] = {
    "two-placements": (200, second_placement),  # 96 slots on the 12 cards: most of the burst waits, gated
    "placement-sigkill": (BURST, lambda stack: kill_service(stack, "placement")),
    "nats-server-sigkill": (BURST, kill_nats),
}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("fault", list(MODE_C_FAULTS))
async def test_a_burst_of_claims_in_mode_c_leaves_the_ledger_equal_to_the_allocations(
    dra_stack: Stack, fault: str
) -> None:
    cluster = dra_stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.api is not None
    api, (burst, act) = cluster.api, MODE_C_FAULTS[fault]
    ns = f"dra-c-{fault}"
    await api.create("/api/v1/namespaces", {"metadata": {"name": ns, "labels": {"gpuledger.io/allocation": "ledger"}}})
    try:
        claims_path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
        creating = asyncio.ensure_future(create_burst(api, ns, burst))
        if fault == "two-placements":
            await act(dra_stack)
        else:
            await wait_for(lambda: _bound_at_least(api, ns, burst // 4), 120, f"{burst // 4} pods bound", 0.2)
            await act(dra_stack)
        await creating
        try:
            await wait_for(
                _steady(api, ns, "GpuledgerUnschedulable"), 300, "every pod running, or gated with a reason", 1
            )
        except TimeoutError:
            await _say_why_unsettled(dra_stack, ns, "GpuledgerUnschedulable")
            raise
        dra_stack.supervisor.check()
        # A claim allocated by a placement killed before it wrote the finalizer gets it from the
        # claims controller once the allocation is WRITING_S old (docs/dra-mode-c.md).
        claims = await wait_for(
            _finalized(api, claims_path), WRITING_S + 60, "gpuledger's finalizer on every allocated claim", 1
        )
        found = await ledger(dra_stack)
        report = check(found.values(), [], 8, time.time())
        assert report.findings == [], report.findings
        allocated = {c["metadata"]["uid"]: c for c in claims if c.get("status", {}).get("allocation")}
        assert not any(conditions(c) for c in allocated.values())  # none allocated by kube-scheduler (mode B)
        held = {
            a.owner.id: sorted(f"gpu-{s.index}" for s in a.shares())
            for entries in found.values()
            for a in entries.live()
            if a.owner.kind is OwnerKind.CLAIM and a.owner.namespace == ns
        }
        assert held == {
            uid: sorted(r["device"] for r in c["status"]["allocation"]["devices"]["results"])
            for uid, c in allocated.items()
        }
        pods = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
        by_claim = {c["metadata"]["name"]: c for c in claims}
        for bound_pod in (p for p in pods if p["spec"].get("nodeName")):
            claim = by_claim[bound_pod["spec"]["resourceClaims"][0]["resourceClaimName"]]
            assert claim["metadata"]["uid"] in allocated, bound_pod["metadata"]["name"]
        running = sum(1 for p in pods if p["status"].get("phase") == "Running")
        print(f"\n  mode C, {fault}: {running} of {burst} pods running, {len(held)} claims held", flush=True)
        assert running >= min(burst * 3 // 4, 72), f"only {running} of {burst} pods run after {fault}"
    finally:
        if fault == "two-placements" and any(s.name == "placement-2" for s in dra_stack.supervisor.services):
            second = dra_stack.supervisor.get("placement-2")
            await second.stop()
            dra_stack.supervisor.services.remove(second)  # the stack's own services are checked on
        await _delete_all(dra_stack, ns)
        await api.delete(f"/api/v1/namespaces/{ns}")


async def _say_why_unsettled(stack: Stack, ns: str, reason: str) -> None:
    """What the pods that are neither Running nor gated with an event of ``reason`` wait for, and
    the logs that name them (the stack's logs are removed with it, so they are kept aside)."""
    cluster = stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.api is not None
    pods = (await cluster.api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
    events = await cluster.api.get(f"/api/v1/namespaces/{ns}/events", fieldSelector=f"reason={reason}")
    told = {(e.get("involvedObject") or {}).get("uid") for e in events["items"]}
    unsettled = [
        p
        for p in pods
        if p["status"].get("phase") != "Running" and (p["spec"].get("nodeName") or p["metadata"]["uid"] not in told)
    ]
    print(await asyncio.to_thread(_explain, stack.supervisor.run_dir, ns, unsettled, len(pods)), flush=True)


def _explain(run_dir: Path, ns: str, unsettled: list[dict[str, Any]], total: int) -> str:
    kept = Path(tempfile.mkdtemp(prefix="gl-unsettled-"))
    for log in run_dir.rglob("*.log"):
        shutil.copy(log, kept / log.name)
    logs = {log.stem: log.read_text(errors="replace").splitlines() for log in sorted(kept.glob("*.log"))}
    said = [f"\n  {len(unsettled)} of {total} pods unsettled; the stack's logs kept in {kept}"]
    for p in unsettled[:10]:
        gates = [g.get("name") for g in p["spec"].get("schedulingGates") or []]
        conds = {c.get("type"): (c.get("status"), c.get("reason")) for c in p["status"].get("conditions") or []}
        name = p["metadata"]["name"]
        said.append(
            f"  {name}: node={p['spec'].get('nodeName')} phase={p['status'].get('phase')} gates={gates} {conds}"
        )
        for stem, lines in logs.items():
            naming = [line for line in lines if re.search(rf"{ns}/{name}\b", line)]
            said.extend(f"    {stem}: {line[:300]}" for line in naming[-4:])
    return "\n".join(said)


async def create_burst(api: KubeApi, ns: str, count: int) -> None:
    """``count`` claims of a 1 GiB, 1 % share (8 a card by slots), each with its pod."""
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER,
               "capacity": {"requests": {"memory": "1Gi", "compute": "1"}}}}  # fmt: skip
    for i in range(count):
        body = {"metadata": {"name": f"c{i}"}, "spec": {"devices": {"requests": [request]}}}
        await api.create(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", body)
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod(f"p{i}", f"c{i}"))


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "gpuledger-scheduler",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "app", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


async def _bound_at_least(api: KubeApi, ns: str, count: int) -> bool:
    found = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
    return sum(1 for p in found if p["spec"].get("nodeName")) >= count


async def _decided(api: KubeApi, claims_path: str) -> bool:
    """Every allocated claim marked committed or rejected by the claims controller."""
    for claim in (await api.get(claims_path))["items"]:
        if claim.get("status", {}).get("allocation") and not (set(conditions(claim)) & {COMMITTED, REJECTED}):
            return False
    return True


def _steady(api: KubeApi, ns: str, reason: str = "FailedScheduling") -> Callable[[], Awaitable[bool]]:
    """Every pod Running, or unbound with an event of ``reason``, for good (``helpers.steady``)."""

    async def running_if_settled() -> int | None:
        pods = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
        if not await _settled(api, ns, pods, reason):
            return None
        return sum(1 for p in pods if p["status"].get("phase") == "Running")

    return steady(running_if_settled)


async def _settled(api: KubeApi, ns: str, pods: list[dict[str, Any]], reason: str = "FailedScheduling") -> bool:
    """Every pod Running, or unbound with an event of ``reason`` (the namespace's events of that
    reason read in one call: a burst leaves a hundred pods waiting)."""
    waiting = [p for p in pods if p["status"].get("phase") != "Running"]
    if any(p["spec"].get("nodeName") for p in waiting):
        return False
    if not waiting:
        return True
    events = await api.get(f"/api/v1/namespaces/{ns}/events", fieldSelector=f"reason={reason}")
    told = {(e.get("involvedObject") or {}).get("uid") for e in events["items"]}
    return all(p["metadata"]["uid"] in told for p in waiting)


@pytest.mark.timeout(300)
async def test_classic_pods_and_claims_at_once_on_the_same_cards_never_over_commit_one(dra_stack: Stack) -> None:
    cluster = dra_stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.api is not None
    api = cluster.api
    ns, ns_c = "mixed", "mixed-c"  # mode B (kube-scheduler allocates, the ledger commits), mode C (the ledger)
    await api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    await api.create(
        "/api/v1/namespaces", {"metadata": {"name": ns_c, "labels": {"gpuledger.io/allocation": "ledger"}}}
    )
    claims_path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    claims_c = f"/apis/resource.k8s.io/v1/namespaces/{ns_c}/resourceclaims"
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER,
               "capacity": {"requests": {"memory": "2Gi", "compute": "1"}}}}  # fmt: skip
    try:

        async def claims_and_pods() -> None:
            for i in range(24):
                body = {"metadata": {"name": f"c{i}"}, "spec": {"devices": {"requests": [request]}}}
                await api.create(claims_path, body)
                await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod(f"dra-{i}", f"c{i}"))

        async def classic_pods() -> None:
            for i in range(24):
                body = pod(f"classic-{i}", ns, share(2048))
                body["spec"]["tolerations"] = [{"operator": "Exists"}]
                await api.create(f"/api/v1/namespaces/{ns}/pods", body)

        async def ledger_claims_and_pods() -> None:
            for i in range(16):
                body = {"metadata": {"name": f"c{i}"}, "spec": {"devices": {"requests": [request]}}}
                await api.create(claims_c, body)
                await api.create(f"/api/v1/namespaces/{ns_c}/pods", claim_pod(f"dra-c-{i}", f"c{i}"))

        await asyncio.gather(claims_and_pods(), classic_pods(), ledger_claims_and_pods())
        await wait_for(_steady(api, ns), 240, "every pod running, or unbound with a reason, for good", 1.0)
        await wait_for(_steady(api, ns_c, "GpuledgerUnschedulable"), 120, "every mode-C pod running or gated", 1.0)
        await wait_for(lambda: _decided(api, claims_path), 60, "every allocated claim committed or rejected", 0.5)
        report = await consistent(cluster, dra_stack)  # the ledger equals the classic pods, no card over capacity
        assert report.ok, report
        found = await ledger(dra_stack)
        claims = (await api.get(claims_path))["items"]
        committed = {c["metadata"]["uid"] for c in claims if conditions(c).get(COMMITTED, {}).get("status") == "True"}
        by_ledger = {c["metadata"]["uid"] for c in (await api.get(claims_c))["items"] if c["status"].get("allocation")}
        held = {a.owner.id for e in found.values() for a in e.live() if a.owner.kind is OwnerKind.CLAIM}
        assert held == committed | by_ledger
        pods = (await api.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
        pods += (await api.get(f"/api/v1/namespaces/{ns_c}/pods"))["items"]
        running = sum(1 for p in pods if p["status"].get("phase") == "Running")
        print(f"\n  mixed: {running} of {len(pods)} pods running, {len(held)} claims held", flush=True)
        assert running >= 48, f"only {running} of 64 pods run"
    finally:
        for each in (ns, ns_c):
            await _delete_all(dra_stack, each)
            await api.delete(f"/api/v1/namespaces/{each}")
