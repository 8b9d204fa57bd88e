"""Least privilege: what each service account may do, and which containers hold a token.

The table below is the contract: each permission is there because the code uses it (the comment
says where). Widening a Role, binding another one, or mounting a token where none is needed fails
here until the table is changed with it.
"""

from __future__ import annotations

from typing import Any

import pytest

from .manifests import PROVIDED, RENDERS, containers, named, of_kind, rendered, workloads

# (namespace or "*" for cluster-wide, API group, resource, verb, resource name or "*"), or
# ("*" or a namespace, "bound", the kind and name of a role the cluster provides).
Grant = tuple[str, ...]

PERMISSIONS: dict[str, set[Grant]] = {
    # gpuledger_allocator/kube.py: list and watch the pods of gpuledger's scheduler, read one by
    # name, for reconciliation (release the cards of deleted or finished pods, rebuild a lost
    # ledger from their annotations).
    "gpuledger-allocator": {
        ("*", "", "pods", "get", "*"),
        ("*", "", "pods", "list", "*"),
        ("*", "", "pods", "watch", "*"),
    },
    "gpuledger-nats": set(),
    # gpuledger_inventory/kube.py: read_node, patch_node (its own Node's gpuledger.io/gpu.* labels).
    # DRA mode (slices.py, publisher.py): the node's own ResourceSlices.
    "gpuledger-inventory": {
        ("*", "", "nodes", "get", "*"),
        ("*", "", "nodes", "patch", "*"),
        *{("*", "resource.k8s.io", "resourceslices", verb, "*")
          for verb in ("get", "list", "watch", "create", "update", "delete")},
    },
    # The extender's bind: read the pod, record the decision in its gpuledger.io/allocation
    # annotation, create its Binding. The guard (gpuledger_placement/hosts.py): list and watch
    # Nodes (allocatable) and bound pods (requests). Preemption (gpuledger_placement/preemptor.py):
    # evict the victims, list PodDisruptionBudgets, record Events. Draining a failing card
    # (gpuledger_placement/drainer.py): evict its pods, record Events on them and on the Node.
    "gpuledger-placement": {
        ("*", "", "pods/eviction", "create", "*"),
        ("*", "policy", "poddisruptionbudgets", "list", "*"),
        ("*", "", "events", "create", "*"),
        ("*", "", "pods", "get", "*"),
        ("*", "", "pods", "patch", "*"),
        ("*", "", "pods/binding", "create", "*"),
        ("*", "", "pods", "list", "*"),
        ("*", "", "pods", "watch", "*"),
        ("*", "", "nodes", "list", "*"),
        ("*", "", "nodes", "watch", "*"),
    },
    # A kube-scheduler: the stock roles, and its own leader-election Lease.
    "gpuledger-scheduler": {
        ("*", "bound", "ClusterRole", "system:kube-scheduler"),
        ("*", "bound", "ClusterRole", "system:volume-scheduler"),
        ("kube-system", "bound", "Role", "extension-apiserver-authentication-reader"),
        ("gpuledger", "coordination.k8s.io", "leases", "create", "*"),
        ("gpuledger", "coordination.k8s.io", "leases", "get", "gpuledger-scheduler"),
        ("gpuledger", "coordination.k8s.io", "leases", "update", "gpuledger-scheduler"),
    },
}

# Which containers get an API token. The plugin shares the node pod with the inventory but never
# calls the API server: the token is projected into the inventory container alone.
TOKEN = {
    "allocator": True,
    "placement": True,
    "kube-scheduler": True,
    "nats": False,
    "inventory": True,
    "plugin": False,
}


def grants(objects: list[dict[str, Any]], account: str) -> set[Grant]:
    found: set[Grant] = set()
    for binding in [*of_kind(objects, "RoleBinding"), *of_kind(objects, "ClusterRoleBinding")]:
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            continue
        scope = binding["metadata"].get("namespace", "*")
        ref = binding["roleRef"]
        if (ref["kind"], ref["name"]) in PROVIDED:
            found.add((scope, "bound", ref["kind"], ref["name"]))
            continue
        for rule in named(objects, ref["kind"], ref["name"])["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames", ["*"]):
                            found.add((scope, group, resource, verb, name))
    return found


@pytest.mark.parametrize("path", RENDERS)
def test_every_service_account_is_in_the_table(path: str) -> None:
    accounts = {a["metadata"]["name"] for a in of_kind(rendered(path), "ServiceAccount")}
    assert accounts == set(PERMISSIONS)


@pytest.mark.parametrize("path", RENDERS)
@pytest.mark.parametrize("account", sorted(PERMISSIONS))
def test_each_service_account_has_exactly_its_permissions(path: str, account: str) -> None:
    assert grants(rendered(path), account) == PERMISSIONS[account]


@pytest.mark.parametrize("path", RENDERS)
def test_no_rule_uses_wildcards(path: str) -> None:
    for role in [*of_kind(rendered(path), "Role"), *of_kind(rendered(path), "ClusterRole")]:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], role["metadata"]["name"]
        assert "aggregationRule" not in role


@pytest.mark.parametrize("path", RENDERS)
def test_only_containers_that_call_the_api_hold_a_token(path: str) -> None:
    objects = rendered(path)
    accounts = {a["metadata"]["name"]: a for a in of_kind(objects, "ServiceAccount")}
    seen = set()
    for _, spec, container in containers(objects):
        account = accounts[spec["serviceAccountName"]]
        automount = spec.get("automountServiceAccountToken", account.get("automountServiceAccountToken", True))
        projected = {
            v["name"]
            for v in spec.get("volumes", [])
            if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
        }
        mounted = any(m["name"] in projected for m in container.get("volumeMounts", []))
        assert (automount or mounted) == TOKEN[container["name"]], container["name"]
        seen.add(container["name"])
    assert seen == set(TOKEN)


@pytest.mark.parametrize("path", RENDERS)
def test_no_container_is_privileged_or_keeps_a_capability(path: str) -> None:
    for workload, spec, container in containers(rendered(path)):
        context = container["securityContext"]
        assert not context.get("privileged", False)
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert "add" not in context["capabilities"]
        assert context["readOnlyRootFilesystem"] is True
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        if workload["kind"] != "DaemonSet":
            assert spec["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]


@pytest.mark.parametrize("path", RENDERS)
def test_only_the_node_agents_mount_host_paths(path: str) -> None:
    for workload, spec in workloads(rendered(path)):
        if any("hostPath" in v for v in spec.get("volumes", [])):
            assert workload["metadata"]["name"] == "gpuledger-node"
