"""The NetworkPolicies: each central service and the node pods take connections only on their own
ports, from whom deploy/kubernetes/base/network.yaml says. No CNI enforces them here, so this checks
what a CNI would act on: which pods each policy selects, which ports and peers it opens, and that
no Service points at a port its pods' policy keeps closed (the real API server accepts them in
tests/e2e/test_cluster_objects.py)."""

from __future__ import annotations

from typing import Any

import pytest

from .manifests import RENDERS, matches, named, of_kind, rendered, workloads

# policy -> {port name: the pods (by app.kubernetes.io/name) it is open to, "*" for anyone}
OPEN = {
    "gpuledger-placement": {"extender": {"gpuledger-scheduler"}, "http": {"*"}},
    "gpuledger-allocator": {"grpc": {"*"}, "http": {"*"}},
    "gpuledger-nats": {"client": {"<namespace>"}, "monitor": {"<namespace>"}, "cluster": {"gpuledger-nats"}},
    "gpuledger-node": {"inventory-http": {"*"}, "plugin-http": {"*"}},
    "gpuledger-scheduler": {"https": {"*"}},
}


def _labels(spec_owner: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = spec_owner["spec"]["template"]["metadata"]["labels"]
    return labels


def _peers(rule: dict[str, Any]) -> set[str]:
    if "from" not in rule:
        return {"*"}
    found = set()
    for peer in rule["from"]:
        assert set(peer) == {"podSelector"}, peer  # only pods of this namespace, never an IP block
        selector = peer["podSelector"].get("matchLabels", {})
        found.add(selector.get("app.kubernetes.io/name", "<namespace>") if selector else "<namespace>")
    return found


@pytest.mark.parametrize("path", RENDERS)
def test_each_policy_opens_exactly_its_ports_to_its_peers(path: str) -> None:
    objects = rendered(path)
    policies = {p["metadata"]["name"]: p for p in of_kind(objects, "NetworkPolicy")}
    assert set(policies) == set(OPEN)
    for name, policy in policies.items():
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        opened: dict[str, set[str]] = {}
        for rule in spec["ingress"]:
            for port in rule["ports"]:
                opened.setdefault(port["port"], set()).update(_peers(rule))
        assert opened == OPEN[name], name


@pytest.mark.parametrize("path", RENDERS)
def test_every_workload_is_selected_by_one_policy_naming_ports_it_has(path: str) -> None:
    objects = rendered(path)
    policies = of_kind(objects, "NetworkPolicy")
    for workload, spec in workloads(objects):
        labels = _labels(workload)
        selecting = [p for p in policies if matches(p["spec"]["podSelector"]["matchLabels"], labels)]
        assert len(selecting) == 1, workload["metadata"]["name"]
        ports = {p["name"] for c in spec["containers"] for p in c.get("ports", [])}
        named_ports = {port["port"] for rule in selecting[0]["spec"]["ingress"] for port in rule["ports"]}
        assert named_ports <= ports, (workload["metadata"]["name"], named_ports - ports)


@pytest.mark.parametrize("path", RENDERS)
def test_no_service_points_at_a_closed_port(path: str) -> None:
    objects = rendered(path)
    policies = of_kind(objects, "NetworkPolicy")
    for service in of_kind(objects, "Service"):
        selector = service["spec"]["selector"]
        (policy,) = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= selector.items()]
        open_ports = {port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in open_ports, (service["metadata"]["name"], port)


def test_the_extender_port_is_open_to_the_schedulers_pods_only() -> None:
    objects = rendered("base")
    policy = named(objects, "NetworkPolicy", "gpuledger-placement")
    scheduler = named(objects, "Deployment", "gpuledger-scheduler")
    [rule] = [r for r in policy["spec"]["ingress"] if any(p["port"] == "extender" for p in r["ports"])]
    [peer] = rule["from"]
    assert matches(peer["podSelector"]["matchLabels"], _labels(scheduler))
