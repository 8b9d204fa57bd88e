"""A pod's node selector, required node affinity and tolerations against a Node (node_fit), as
kube-scheduler's filters decide them."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_placement.node_fit import node_refusal

LABELS = {"kubernetes.io/hostname": "n1", "zone": "a", "gpus": "8"}


def pod(**spec: Any) -> dict[str, Any]:
    return {"spec": spec}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def field(operator: str) -> dict[str, Any]:
    return {"matchFields": [{"key": "metadata.name", "operator": operator, "values": ["n1"]}]}


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


@pytest.mark.parametrize(
    ("spec", "fits"),
    [
        ({}, True),
        ({"nodeSelector": {"zone": "a"}}, True),
        ({"nodeSelector": {"zone": "b"}}, False),
        ({"affinity": affinity(expression("kubernetes.io/hostname", "In", "n1", "n2"))}, True),
        ({"affinity": affinity(expression("kubernetes.io/hostname", "In", "n2"))}, False),
        ({"affinity": affinity(expression("kubernetes.io/hostname", "In", "n2"), expression("zone", "Exists"))}, True),
        ({"affinity": affinity(expression("zone", "NotIn", "a"))}, False),
        ({"affinity": affinity(expression("rack", "DoesNotExist"))}, True),
        ({"affinity": affinity(expression("gpus", "Gt", "4"))}, True),
        ({"affinity": affinity(expression("gpus", "Lt", "4"))}, False),
        ({"affinity": affinity(field("In"))}, True),
        ({"affinity": affinity(field("NotIn"))}, False),
        ({"affinity": affinity({})}, False),  # an empty term matches no node
    ],
)
def test_selector_and_required_affinity(spec: dict[str, Any], fits: bool) -> None:
    assert (node_refusal(pod(**spec), "n1", LABELS, []) == "") is fits


def test_a_blocking_taint_needs_a_toleration() -> None:
    taint = {"key": "gpuledger.io/gpu-node", "effect": "NoSchedule"}
    said = node_refusal(pod(), "n1", LABELS, [taint])
    assert said == "node n1 has the taint gpuledger.io/gpu-node=:NoSchedule"
    exists = [{"key": "gpuledger.io/gpu-node", "operator": "Exists"}]
    assert node_refusal(pod(tolerations=exists), "n1", LABELS, [taint]) == ""
    assert node_refusal(pod(tolerations=[{"operator": "Exists"}]), "n1", LABELS, [taint]) == ""
    wrong_effect = [{"key": "gpuledger.io/gpu-node", "operator": "Exists", "effect": "NoExecute"}]
    assert node_refusal(pod(tolerations=wrong_effect), "n1", LABELS, [taint])
    equal = {"key": "dedicated", "value": "ml", "effect": "NoExecute"}
    assert node_refusal(pod(tolerations=[{"key": "dedicated", "value": "ml"}]), "n1", LABELS, [equal]) == ""
    assert node_refusal(pod(tolerations=[{"key": "dedicated", "value": "db"}]), "n1", LABELS, [equal])
    assert node_refusal(pod(), "n1", LABELS, [{"key": "soft", "effect": "PreferNoSchedule"}]) == ""
