"""Preemption for pods kube-scheduler left Unschedulable (DRA mode B, ``claim_preempt_b``): which
pods are looked at, and a claim is preempted for only where the ledger has no room for it."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gpuledger_core.claim_asks import ClaimAsk
from gpuledger_core.errors import NotFound
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Node
from gpuledger_core.packing import make_policy
from gpuledger_placement.claim_cache import ClaimCache
from gpuledger_placement.claim_preempt_b import ModeBPreemption, unschedulable
from gpuledger_placement.view import FleetView
from tests.unit.core.builders import card
from tests.unit.core.test_claim_placement import held

DRIVER = "gpu.gpuledger.io"
REFUSED = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
CLASS = {
    "metadata": {"name": DRIVER, "annotations": {"gpuledger.io/allocation": "scheduler"}},  # mode B's class
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}


def pod(name: str, claim: str, conditions: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}], **spec},
        "status": {"conditions": [REFUSED] if conditions is None else conditions},
    }


def claim(name: str, memory: str, allocated: bool = False) -> dict[str, Any]:
    request = {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory, "compute": "10"}}}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        "status": {"allocation": {"devices": {"results": []}}} if allocated else {},
    }


def test_only_a_pod_kube_scheduler_refused_unbound_ungated_and_with_claims_is_looked_at() -> None:
    assert unschedulable(pod("p", "c"))
    assert not unschedulable(pod("p", "c", [{**REFUSED, "reason": "SchedulingGated"}]))
    assert not unschedulable(pod("p", "c", [{**REFUSED, "status": "True"}]))
    assert not unschedulable(pod("p", "c", schedulingGates=[{"name": "gpuledger.io/allocate"}]))
    assert not unschedulable(pod("p", "c", nodeName="n1"))
    assert not unschedulable({**pod("p", "c"), "spec": {}})


class _Api:
    def __init__(self, claims: Mapping[str, dict[str, Any]]) -> None:
        self.claims = claims
        self.reads: list[str] = []

    async def get_object(self, path: str) -> dict[str, Any]:
        self.reads.append(path)
        name = path.rsplit("/", 1)[-1]
        if name not in self.claims:
            raise NotFound(path)
        return copy.deepcopy(self.claims[name])

    async def list_objects(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        assert path.endswith("/deviceclasses"), path
        return {"items": [CLASS]}

    def watch(self, path: str, params: Mapping[str, str]) -> Any:
        raise AssertionError("not followed here")


def _preemption(claims: Mapping[str, dict[str, Any]]) -> tuple[ModeBPreemption, list[tuple[str, ClaimAsk, list[str]]]]:
    """Node n1: card 0 full, card 1 with 4000 of its 16000 MiB free."""
    view = FleetView(None, 3600.0, slots_per_card=8)
    ledger = held(held(NodeLedger(Node(NodeName("n1"), (card(0, 16000), card(1, 16000)))), 0, 16000), 1, 12000)
    view.apply(NodeName("n1"), ledger, 1)
    preempted: list[tuple[str, ClaimAsk, list[str]]] = []
    controller = SimpleNamespace(cache=ClaimCache(), driver=DRIVER, memory_step_mib=256)
    found = ModeBPreemption(
        cast(Any, _Api(claims)), cast(Any, controller), view, lambda: make_policy("default"),
        lambda raw, ask, nodes: preempted.append((raw["metadata"]["name"], ask, nodes)),
    )  # fmt: skip
    return found, preempted


async def test_a_claim_that_fits_on_no_node_is_preempted_for_once_a_retry_and_one_that_fits_is_not() -> None:
    claims = {"big": claim("big", "8Gi"), "small": claim("small", "2Gi"), "done": claim("done", "8Gi", True)}
    preemption, preempted = _preemption(claims)
    preemption.offer(pod("wants-big", "big"))
    preemption.offer(pod("wants-big", "big"))  # again within retry_s: not looked at twice
    preemption.offer(pod("wants-small", "small"))  # fits card 1: kube-scheduler's refusal is not for cards
    preemption.offer(pod("has-done", "done"))  # allocated already
    preemption.offer(pod("bound", "big", nodeName="n1"))
    await asyncio.wait_for(preemption.idle(), 2.0)
    assert [(name, ask.ref.name, nodes) for name, ask, nodes in preempted] == [("wants-big", "big", ["n1"])]
    assert preempted[0][1].requests[0].choices[0][1].mem_mib == 8192


async def test_a_pod_whose_claim_is_missing_is_not_preempted_for(caplog: pytest.LogCaptureFixture) -> None:
    preemption, preempted = _preemption({})
    preemption.offer(pod("early", "not-made"))
    await asyncio.wait_for(preemption.idle(), 2.0)
    assert preempted == [] and "uid-early" in preemption._looked  # looked at again after retry_s
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # kube-scheduler says so already
