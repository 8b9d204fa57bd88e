"""DRA mode C's first step on the real control plane: a claim allocated by gpuledger (its
``status.allocation`` written from a ledger allocation by ``gpuledger_core.claim_status``, on a card
kube-scheduler's first-fit would not take) is accepted by kube-apiserver as written, and
kube-scheduler 1.36 puts the claim's pod on that node and binds it at once, without the 5 s
binding-condition wait, though the slices carry binding conditions (docs/dra-mode-c.md)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpuledger_core import claims
from gpuledger_core.claim_status import allocation_status
from gpuledger_core.claims import ClaimRef
from gpuledger_core.model import Allocation, CardShare, Grant
from gpuledger_dev.controlplane.cluster import ControlPlane, plain_scheduler_config
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.slices import DRIVER
from tests.e2e.dra_helpers import (
    CLAIMS,
    SCHEDULER,
    claim_pod,
    dra_node,
    ensure_device_class,
    namespace,
    published,
    share_claim,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]


async def test_kube_scheduler_binds_a_pod_to_the_allocation_gpuledger_wrote_at_once(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    await asyncio.to_thread(control_plane.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    node_cm = dra_node(control_plane, nats_server, "tesla-p4-2", dra_binding_conditions=True)
    async with node_cm as node, namespace(node.api, f"{node.name}-c") as ns:
        (found,) = await published(node)
        assert found["spec"]["devices"][1]["bindingConditions"]  # mode B's slices
        await ensure_device_class(node.api)
        api, path = node.api, CLAIMS.format(ns=ns)
        claim = await api.create(path, share_claim("chosen", "4Gi", "25"))
        ref = ClaimRef(ns, "chosen", claim["metadata"]["uid"])
        model = node.running.inventory.state.node()
        share = CardShare(model.cards[1].uuid, 1, 4096, 250)  # first-fit would take gpu-0
        allocation = Allocation(claims.allocation_id(ref, ()), ref.owner, model.name, (Grant("gpu", (share,)),))
        claim["status"] = {"allocation": allocation_status(allocation, model, DRIVER, time.time(), shareable=True)}
        written = await api.call("PUT", f"{path}/chosen/status", claim)
        assert claims.results_of(written, DRIVER) == claims.results_of(claim, DRIVER)  # kept as written

        started = time.monotonic()
        await api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("app", node.name, "chosen"))

        async def bound() -> bool:
            pod = await api.get(f"/api/v1/namespaces/{ns}/pods/app")
            return bool(pod["spec"].get("nodeName") == node.name)

        await wait_for(bound, 30, "the pod bound to the node of its claim", 0.05)
        took = time.monotonic() - started
        after = await api.get(f"{path}/chosen")
        assert claims.results_of(after, DRIVER) == claims.results_of(claim, DRIVER)  # the allocation left as it was
        assert [r["name"] for r in after["status"]["reservedFor"]] == ["app"]
        events = await api.get(f"/api/v1/namespaces/{ns}/events", fieldSelector="reason=BindingConditionsPending")
        assert not events["items"], events["items"]
        assert took < 4.0, took  # no binding-condition wait (its second check comes 5 s after the first)
        (held,) = claims.ledger_allocation(ref, claims.results_of(after, DRIVER), model, 0.0).shares()
        assert (held.index, held.mem_mib, held.core_milli) == (1, 4096, 250)  # read back as the ledger holds it
