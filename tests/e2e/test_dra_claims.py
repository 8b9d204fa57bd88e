"""The ledger decides DRA allocations, on the real control plane: the inventory publishes its slices
with the binding condition, the real kube-scheduler allocates a claim and waits at PreBind, and
placement's claims controller reserves exactly that allocation in the ledger and marks the claim
committed, so the pod binds; a card the ledger gives to someone else (a tool) is refused with the
ledger's reason and the pod waits, unbound, until the card is free; deleting the pod and the claim
releases the entry; a controller started afresh rebuilds the ledger's entries from the claims."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from gpuledger_common.store import LedgerStore
from gpuledger_core import claims
from gpuledger_core.claims import AllocatedDevice, ClaimRef
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Isolation, OwnerKind
from gpuledger_dev.controlplane.cluster import ControlPlane
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.slices import DRIVER
from gpuledger_plugin.dra.app import running
from gpuledger_plugin.dra.settings import DraSettings
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.e2e.dra_helpers import (
    CLAIMS,
    allocated_claim,
    claim_pod,
    share_claim,
)
from tests.e2e.dra_ledger import (
    COMMITTED,
    REJECTED,
    bound,
    claim_entry,
    conditions,
    gated_world,
    ledger_of,
    placement_with_claims,
)
from tests.support.replicas import RunningAllocator
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(360), pytest.mark.asyncio(loop_scope="session")]


async def test_placement_may_write_the_status_of_our_driver_only_and_allocations(
    control_plane: ControlPlane, placement_kubeconfig: Path
) -> None:
    """The claims controller writes the device status of our driver alone; mode C's allocator
    writes allocations (resourceclaims/binding) and its finalizer (update), and nothing else."""
    def can_i(*args: str) -> bool:
        done = control_plane.kubectl(
            "auth", "can-i", *args, "--all-namespaces", "--as=system:serviceaccount:gpuledger:gpuledger-placement",
            check=False,
        )  # fmt: skip
        return done.stdout.strip() == "yes"

    assert can_i("watch", "resourceclaims.resource.k8s.io")
    assert can_i("update", "resourceclaims.resource.k8s.io", "--subresource", "status")
    assert can_i("arbitrary-node:update", "resourceclaims.resource.k8s.io/gpu.gpuledger.io", "--subresource", "driver")
    assert not can_i(
        "arbitrary-node:update", "resourceclaims.resource.k8s.io/nic.example.com", "--subresource", "driver"
    )
    assert can_i("update", "resourceclaims.resource.k8s.io", "--subresource", "binding")  # mode C
    assert can_i("update", "resourceclaims.resource.k8s.io")  # mode C's finalizer
    assert not can_i("patch", "resourceclaims.resource.k8s.io", "--subresource", "binding")
    assert not can_i("delete", "resourceclaims.resource.k8s.io")
    assert not can_i("create", "resourceclaims.resource.k8s.io")
    assert not can_i("update", "deviceclasses.resource.k8s.io")
    assert not can_i("delete", "pods")


async def test_the_ledger_commits_a_share_and_the_scheduler_binds_the_pod_then_deleting_releases(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Path
) -> None:
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "h100-sxm-8") as world:
        node, api, ns = world.node, world.api, world.ns
        (devices,) = [s["spec"]["devices"] for s in await node.slices()]
        assert devices[0]["bindingConditions"] == [COMMITTED]
        await api.create(CLAIMS.format(ns=ns), share_claim("share", "10Gi", "25"))
        created = time.monotonic()
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("app", node.name, "share"))
        pod = await bound(api, ns, "app")
        print(f"\n  pod bound {time.monotonic() - created:.1f}s after it was created (PreBind polls every 5s)")
        claim = await api.get(f"{CLAIMS.format(ns=ns)}/share")
        assert conditions(claim)[COMMITTED]["status"] == "True", claim["status"]
        assert REJECTED not in conditions(claim)
        uid = claim["metadata"]["uid"]
        entry = await claim_entry(nats_server, node.name, uid)
        assert entry is not None and entry.live, f"no ledger entry for claim {uid}"
        (share,) = entry.shares()
        ledger = await ledger_of(nats_server, node.name)
        assert ledger is not None
        card0 = next(c for c in ledger.node.cards if c.index == 0)
        assert (share.uuid, share.mem_mib, share.core_milli, share.exclusive) == (card0.uuid, 10240, 250, False)
        assert entry.owner.namespace == ns and entry.owner.name == "share"
        assert pod["spec"]["nodeName"] == node.name

        await api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/app", params={"gracePeriodSeconds": "0"})
        await api.delete(f"{CLAIMS.format(ns=ns)}/share")

        async def released() -> bool:
            return await claim_entry(nats_server, node.name, uid) is None

        await wait_for(released, 60, "the claim's ledger entry released", 0.2)


async def tool_takes(allocator: RunningAllocator, node: str, n: int) -> dict[int, str]:
    """``n`` whole cards of ``node`` for a tool, through the allocator: card index -> allocation id."""
    stub = allocator.stub()
    held = {}
    for i in range(n):
        request = pb.AllocateRequest(
            owner=pb.Owner(kind="tool", id=f"batch/job-{i}"),
            containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1))],
            commit=True,
            node=node,
        )
        allocation = (await stub.allocate(request)).allocation
        held[allocation.grants[0].cards[0].index] = allocation.id
    return held


def whole_claim(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}  # fmt: skip


def held_taints(slices: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {
        d["name"]: [t["key"] for t in d.get("taints", []) if t["key"] == f"{DRIVER}/held"]
        for s in slices
        for d in s["spec"]["devices"]
    }


async def test_a_card_a_tool_holds_is_tainted_in_the_slice_so_the_scheduler_takes_another(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Path
) -> None:
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        node, api, ns, allocator = world.node, world.api, world.ns, world.allocator
        held = await tool_takes(allocator, node.name, 1)
        assert list(held) == [0]

        async def tainted() -> bool:
            return held_taints(await node.slices()) == {"gpu-0": [f"{DRIVER}/held"], "gpu-1": []}

        await wait_for(tainted, 30, "gpu-0 tainted as held outside DRA", 0.1)
        await api.create(CLAIMS.format(ns=ns), whole_claim("whole"))
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("app", node.name, "whole"))
        await bound(api, ns, "app")
        claim = await api.get(f"{CLAIMS.format(ns=ns)}/whole")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-1" and REJECTED not in conditions(claim)
        await allocator.stub().release(pb.ReleaseRequest(allocation_id=held[0]))

        async def untainted() -> bool:
            return held_taints(await node.slices()) == {"gpu-0": [], "gpu-1": []}

        await wait_for(untainted, 30, "gpu-0's taint gone with the tool's allocation", 0.1)


async def test_a_card_the_ledger_gave_a_tool_before_the_slices_show_it_is_refused_and_the_pod_waits(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Path
) -> None:
    """The race the taint cannot close: the slices lag the ledger (here, they never catch up)."""
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "tesla-p4-2") as world:
        node, api, ns, allocator = world.node, world.api, world.ns, world.allocator
        # A tool takes both cards whole through the allocator, and the slices do not show it.
        node.publisher.set_ledger = lambda ledger: None  # type: ignore[method-assign]
        held = await tool_takes(allocator, node.name, 2)
        await api.create(CLAIMS.format(ns=ns), whole_claim("whole"))
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("app", node.name, "whole"))

        async def rejected() -> dict[str, Any] | None:
            claim = await api.get(f"{CLAIMS.format(ns=ns)}/whole")
            return conditions(claim).get(REJECTED)

        refusal = await wait_for(rejected, 60, "the claim rejected by the ledger", 0.1)
        assert refusal["status"] == "True" and refusal["reason"] == "LedgerRefused"
        assert "held by 1 other" in refusal["message"], refusal
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/app")
        assert not pod["spec"].get("nodeName"), "a pod bound to a card the ledger refused"
        ledger = await ledger_of(nats_server, node.name)
        assert ledger is not None
        assert [a.owner.kind for a in ledger.live()] == [OwnerKind.TOOL, OwnerKind.TOOL]
        # The tool lets go of one card: the scheduler's next try is committed and the pod binds.
        await allocator.stub().release(pb.ReleaseRequest(allocation_id=held[0]))  # card 0: first-fit's choice
        await bound(api, ns, "app", timeout=120)
        claim = await allocated_claim(api, ns, "whole")
        assert conditions(claim)[COMMITTED]["status"] == "True"
        entry = await claim_entry(nats_server, node.name, claim["metadata"]["uid"])
        assert entry is not None and entry.shares()[0].exclusive


async def test_a_started_controller_rebuilds_entries_from_the_claims_and_releases_orphans(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Path
) -> None:
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "h100-sxm-8", placement=False) as world:
        node, api, ns = world.node, world.api, world.ns
        async with placement_with_claims(nats_server, placement_kubeconfig):
            await api.create(CLAIMS.format(ns=ns), share_claim("kept", "8Gi", "20"))
            await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("kept", node.name, "kept"))
            await bound(api, ns, "kept")
        uid = (await api.get(f"{CLAIMS.format(ns=ns)}/kept"))["metadata"]["uid"]
        # With no controller running, the ledger loses the entry (a wiped bucket, say)...
        nc = await nats.connect(nats_server.url)
        try:
            store = await LedgerStore.open(nc)
            entry = await claim_entry(nats_server, node.name, uid)
            assert entry is not None

            gone = ClaimRef(ns, "gone", "uid-of-a-deleted-claim")
            device = AllocatedDevice("gpu", node.name, "gpu-7")

            def forget(ledger: NodeLedger | None) -> NodeLedger | None:
                """The claim's entry lost, and one left behind by a claim deleted long ago."""
                assert ledger is not None
                kept = tuple(a for a in ledger.allocations if a.id != entry.id)
                orphan = claims.ledger_allocation(gone, [device], ledger.node, time.time() - 3600)
                return type(ledger)(ledger.node, (*kept, orphan))

            await store.mutate(node.name, forget)
        finally:
            await nc.close()
        assert await claim_entry(nats_server, node.name, uid) is None
        assert await claim_entry(nats_server, node.name, gone.uid) is not None
        # ...and a started controller writes it again from the claim, and releases the orphan.
        async with placement_with_claims(nats_server, placement_kubeconfig):

            async def rebuilt() -> Allocation | None:
                return await claim_entry(nats_server, node.name, uid)

            again = await wait_for(rebuilt, 30, "the claim's entry rebuilt", 0.2)
            assert again.id == entry.id and again.shares() == entry.shares()

            async def orphan_released() -> bool:
                return await claim_entry(nats_server, node.name, gone.uid) is None

            await wait_for(orphan_released, 30, "the orphaned entry released", 0.2)


async def test_an_mps_claim_is_held_as_mps_its_card_says_so_and_an_unisolated_share_goes_elsewhere(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Path, tmp_path: Path
) -> None:
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "h100-sxm-8") as world:
        node, api, ns = world.node, world.api, world.ns
        mps = share_claim("mps", "10Gi", "25")
        mps["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = f"mps.{DRIVER}"
        await api.create(CLAIMS.format(ns=ns), mps)
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("mps", node.name, "mps"))
        await bound(api, ns, "mps")
        claim = await api.get(f"{CLAIMS.format(ns=ns)}/mps")
        (config,) = claim["status"]["allocation"]["devices"]["config"]
        assert config["source"] == "FromClass" and config["opaque"]["parameters"]["isolation"] == "mps"
        entry = await claim_entry(nats_server, node.name, claim["metadata"]["uid"])
        assert entry is not None and entry.isolation is Isolation.MPS and entry.shares()[0].index == 0

        async def says_mps() -> bool:
            devices = [d for s in await node.slices() for d in s["spec"]["devices"]]
            return any(d["name"] == "gpu-0" and d["attributes"]["tenancy"] == {"string": "mps"} for d in devices)

        await wait_for(says_mps, 30, "gpu-0's tenancy published as mps", 0.1)
        # An unisolated share may not join MPS tenants: the default class skips gpu-0.
        await api.create(CLAIMS.format(ns=ns), share_claim("plain", "10Gi", "25"))
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("plain", node.name, "plain"))
        await bound(api, ns, "plain")
        plain = await api.get(f"{CLAIMS.format(ns=ns)}/plain")
        assert plain["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1"
        # The plugin makes the mps claim an MPS client.
        settings = DraSettings(
            node=node.name, registry_dir=str(tmp_path / "reg"), plugin_dir=str(tmp_path / "p"),
            cdi_dir=str(tmp_path / "cdi"), kubeconfig=str(control_plane.admin_kubeconfig), http_host="127.0.0.1",
            http_port=0, nats_url=nats_server.url,
        )  # fmt: skip
        async with running(settings) as plugin:
            ref = ClaimRef(ns, "mps", claim["metadata"]["uid"])
            outcome = (await plugin.preparer.prepare([ref]))[ref.uid]
        assert outcome.error == "", outcome.error
        (spec_file,) = (tmp_path / "cdi").glob("*.json")
        env = dict(e.split("=", 1) for e in json.loads(spec_file.read_text())["containerEdits"]["env"])
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


async def test_nvlink_if_possible_else_any_and_shares_on_distinct_cards(
    control_plane: ControlPlane, nats_server: NatsServer, placement_kubeconfig: Path
) -> None:
    """DGX-1 (the fully linked quads are 0-3 and 4-7). With a card of each quad taken, a claim for
    "4 linked cards, else any 4" gets its second choice; two shares asked to be on distinct cards
    (``distinctAttribute`` on the uuid) get two cards; the ledger holds each as allocated."""
    async with gated_world(control_plane, nats_server, placement_kubeconfig, "dgx1-v100") as world:
        node = world.node
        for name, index in (("one", 0), ("two", 4)):  # a card of each quad, chosen by a CEL selector
            selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].index == {index}'}}
            whole = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "selectors": [selector]}}
            await world.claimed(name, {"requests": [whole]})
        choices = {"name": "gpu", "firstAvailable": [
            {"name": "linked", "deviceClassName": DRIVER, "count": 4},
            {"name": "any", "deviceClassName": DRIVER, "count": 4},
        ]}  # fmt: skip
        linked = {"requests": ["gpu/linked"], "matchAttribute": f"{DRIVER}/nvlinkGroup4"}
        claim = await world.claimed("four", {"requests": [choices], "constraints": [linked]})
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {r["request"] for r in results} == {"gpu/any"}, results
        entry = await claim_entry(nats_server, node.name, claim["metadata"]["uid"])
        assert entry is not None
        assert sorted(f"gpu-{s.index}" for s in entry.shares()) == sorted(r["device"] for r in results)
        assert [g.container for g in entry.grants] == ["gpu"]  # a firstAvailable choice counts for its request
        # Two shares of one claim on distinct cards.
        pair = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 2,
                "capacity": {"requests": {"memory": "1Gi", "compute": "5"}}}}  # fmt: skip
        distinct = {"requests": ["gpu"], "distinctAttribute": f"{DRIVER}/uuid"}
        claim = await world.claimed("pair", {"requests": [pair], "constraints": [distinct]})
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len({r["device"] for r in results}) == 2, results
        entry = await claim_entry(nats_server, node.name, claim["metadata"]["uid"])
        assert entry is not None and len({s.uuid for s in entry.shares()}) == 2
        assert all(not s.exclusive and s.mem_mib == 1024 for s in entry.shares())
