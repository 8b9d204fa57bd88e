"""Whether a pod may go to a Node by its labels and taints, as kube-scheduler's NodeAffinity and
TaintToleration filters decide (pure): DRA mode C chooses the node of a gated pod's claims, and a
node the pod cannot go to would only have its allocation taken back by kube-scheduler's PostFilter.

``spec.nodeSelector``; the required node affinity (terms ORed, within a term every requirement:
``matchExpressions`` on labels with ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``,
``matchFields`` on ``metadata.name``); ``NoSchedule`` and ``NoExecute`` taints without a
toleration. The preferred terms and ``PreferNoSchedule`` only weigh in kube-scheduler's scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BLOCKING = ("NoSchedule", "NoExecute")


def node_refusal(
    pod: Mapping[str, Any], node: str, labels: Mapping[str, str], taints: Sequence[Mapping[str, Any]]
) -> str:
    """Why ``pod`` may not go to ``node``; empty when it may."""
    spec = pod.get("spec") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"node {node} does not match the pod's nodeSelector {key}={value}"
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    if terms and not any(_term(t, node, labels) for t in terms):
        return f"node {node} does not match the pod's required node affinity"
    for taint in taints:
        if taint.get("effect") in BLOCKING and not any(_tolerates(t, taint) for t in spec.get("tolerations") or []):
            return f"node {node} has the taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
    return ""


def _term(term: Mapping[str, Any], node: str, labels: Mapping[str, str]) -> bool:
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_matches(e, labels) for e in expressions) and all(_matches(f, {"metadata.name": node}) for f in fields)


def _matches(requirement: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, op = str(requirement.get("key", "")), requirement.get("operator")
    wanted = [str(v) for v in requirement.get("values") or []]
    have = values.get(key)
    if op == "In":
        return have is not None and have in wanted
    if op == "NotIn":
        return have is None or have not in wanted
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(wanted) == 1:
        try:
            number, bound = int(have), int(wanted[0])
        except ValueError:
            return False
        return number > bound if op == "Gt" else number < bound
    return False


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration.get("key") == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a label selector (``matchLabels``, ``matchExpressions``) selects ``labels``: an empty
    one selects everything, a missing one (None) nothing, as a PodDisruptionBudget's does."""
    if selector is None:
        return False
    wanted = selector.get("matchLabels") or {}
    if any(labels.get(str(k)) != str(v) for k, v in wanted.items()):
        return False
    return all(_matches(e, labels) for e in selector.get("matchExpressions") or [])
