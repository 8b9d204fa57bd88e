"""Preemption's pure parts in placement: a running pod as a possible victim (priority, start,
PodDisruptionBudget), the annotation a preempting pod carries, which of its victims are still
there, and label selectors as a budget's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuledger_core.errors import NotFound
from gpuledger_placement.node_fit import selects
from gpuledger_placement.preemption_holders import holder_of, priority_of
from gpuledger_placement.preemption_note import PREEMPTION_ANNOTATION, Preemption, preemption_of, victim_left


def running(labels: dict[str, str], priority: int | None = 5, ns: str = "team") -> dict[str, Any]:
    spec = {} if priority is None else {"priority": priority}
    return {"metadata": {"namespace": ns, "name": "p", "uid": "u", "labels": labels,
                         "creationTimestamp": "2026-12-01T00:00:00Z"},
            "spec": spec, "status": {"startTime": "2026-12-01T00:00:10Z"}}  # fmt: skip


def budget(selector: dict[str, Any] | None, allowed: int, ns: str = "team") -> dict[str, Any]:
    spec = {} if selector is None else {"selector": selector}
    return {"metadata": {"namespace": ns, "name": "b"}, "spec": spec, "status": {"disruptionsAllowed": allowed}}


def test_a_holder_has_its_priority_and_start() -> None:
    found = holder_of(running({"app": "x"}), [])
    assert (found.priority, found.protected) == (5, False)
    assert found.started_at == datetime(2026, 12, 1, 0, 0, 10, tzinfo=UTC).timestamp()  # status.startTime
    assert priority_of(running({}, priority=None)) == 0


def test_a_holder_frees_its_pod_s_cpu_and_memory_requests_on_the_host() -> None:
    pod = running({})
    pod["spec"]["containers"] = [
        {"name": "a", "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}},
        {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "512Mi"}}},
    ]
    found = holder_of(pod, [])
    assert (found.cpu_milli, found.memory_mib) == (2500, 2560)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"  # no quantity: nothing counted
    assert (holder_of(pod, []).cpu_milli, holder_of(pod, []).memory_mib) == (0, 0)


def test_a_budget_protects_only_the_pods_it_selects_in_its_namespace_while_it_allows_no_disruption() -> None:
    pod = running({"app": "x", "tier": "db"})
    assert holder_of(pod, [budget({"matchLabels": {"app": "x"}}, 0)]).protected
    assert not holder_of(pod, [budget({"matchLabels": {"app": "x"}}, 1)]).protected  # one may go
    assert not holder_of(pod, [budget({"matchLabels": {"app": "y"}}, 0)]).protected
    assert not holder_of(pod, [budget({"matchLabels": {"app": "x"}}, 0, ns="other")]).protected
    expressions = {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db", "cache"]}]}
    assert holder_of(pod, [budget(expressions, 0)]).protected
    assert holder_of(pod, [budget({}, 0)]).protected  # an empty selector selects every pod
    assert not holder_of(pod, [budget(None, 0)]).protected  # a missing one selects none


def test_selectors_combine_labels_and_expressions() -> None:
    labels = {"app": "x", "tier": "db"}
    assert selects({"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}, labels)
    assert not selects(
        {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, labels
    )
    assert selects({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["web"]}]}, labels)


def test_the_preemption_annotation_reads_back_and_anything_else_reads_as_none() -> None:
    note = Preemption("p4-1", 100.0, 120.0, ("team/low-0/uid-0", "team/low-1/uid-1"), held=True)
    pod = {"metadata": {"annotations": {PREEMPTION_ANNOTATION: note.encode()}}}
    assert preemption_of(pod) == note
    for text in ("", "{", '{"node": "n"}', '["a"]', '{"node": "n", "at": "x", "holdSeconds": 1, "victims": []}'):
        assert preemption_of({"metadata": {"annotations": {PREEMPTION_ANNOTATION: text}}}) is None
    assert preemption_of({"metadata": {}}) is None


async def test_a_victim_is_left_while_a_pod_of_its_name_and_uid_exists() -> None:
    note = Preemption("p4-1", 100.0, 120.0, ("team/low-0/uid-0", "team/low-1/uid-1"), held=True)
    pod = {"metadata": {"annotations": {PREEMPTION_ANNOTATION: note.encode()}}}
    existing = {("team", "low-0"): "uid-0", ("team", "low-1"): "uid-1"}

    async def get_pod(namespace: str, name: str) -> dict[str, Any]:
        if (namespace, name) not in existing:
            raise NotFound(f"pod {namespace}/{name}")
        return {"metadata": {"uid": existing[(namespace, name)]}}

    assert await victim_left(pod, get_pod) == "team/low-0"
    del existing[("team", "low-0")]
    assert await victim_left(pod, get_pod) == "team/low-1"
    existing[("team", "low-1")] = "uid-of-a-new-pod"  # a pod of the same name, created again
    assert await victim_left(pod, get_pod) == ""
    assert await victim_left({"metadata": {}}, get_pod) == ""  # no preemption for it
