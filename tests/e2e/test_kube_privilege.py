"""Kubernetes least privilege as the real API server enforces it, with the shipped objects applied:
every service account may do what the RBAC table (tests/unit/deploy/test_rbac.py) grants and none of
the sensitive things it does not (``kubectl auth can-i``); the inventory, acting with a token bound
to its pod on one node, may change only that Node and only its ``gpuledger.io/`` labels, and write
only that node's ResourceSlices of gpuledger's driver (the ValidatingAdmissionPolicies of
deploy/kubernetes/base/admission.yaml); and the central workloads pass Pod Security ``restricted``."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.controlplane.cluster import Access, ControlPlane
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.support.waiting import wait_for
from tests.unit.deploy.test_rbac import PERMISSIONS

pytestmark = pytest.mark.asyncio(loop_scope="session")

BASE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "base"
NAMESPACE = "gpuledger"
INVENTORY = f"system:serviceaccount:{NAMESPACE}:gpuledger-inventory"
OWN, OTHER = "p4-0", "p4-1"
APPLIED = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
# What no gpuledger service account may do (verb, resource, namespace or "" for all).
NEVER = [
    ("get", "secrets", NAMESPACE),
    ("list", "secrets", ""),
    ("delete", "pods", ""),
    ("create", "pods", ""),
    ("create", "pods/exec", ""),
    ("delete", "nodes", ""),
    ("update", "nodes/status", ""),
    ("create", "clusterrolebindings", ""),
    ("update", "resourceclaims/status", ""),
    ("delete", "validatingadmissionpolicies", ""),
]


# What system:kube-scheduler itself holds of NEVER: deleting pods (preemption), writing a claim's
# allocation (DRA).
SCHEDULERS_OWN = {("delete", "pods"), ("update", "resourceclaims/status")}


def render(cp: ControlPlane) -> list[dict[str, Any]]:
    """The base's RBAC and admission objects, rendered by the real kubectl's kustomize."""
    out = cp.kubectl("kustomize", str(BASE)).stdout
    return [o for o in yaml.safe_load_all(out) if o and o["kind"] in APPLIED]


@pytest.fixture(scope="module")
def applied(stack: Stack) -> list[dict[str, Any]]:
    assert isinstance(stack.cluster, RealCluster)
    cp = stack.cluster.control_plane
    cp.kubectl("create", "namespace", NAMESPACE, check=False)
    objects = render(cp)
    cp.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump_all(objects))
    return objects


def can_i(cp: ControlPlane, account: str, verb: str, resource: str, namespace: str, name: str = "") -> bool:
    """``kubectl auth can-i`` as the account; ``resource`` may name a subresource (``pods/binding``),
    ``namespace`` empty asks across every namespace."""
    main, _, sub = resource.partition("/")
    args = [verb, f"{main}/{name}" if name else main, *(["--subresource", sub] if sub else [])]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    done = cp.kubectl("auth", "can-i", *args, f"--as=system:serviceaccount:{NAMESPACE}:{account}", check=False)
    answer = done.stdout.strip()
    assert answer in ("yes", "no"), done.stderr
    return answer == "yes"


def _resource(group: str, resource: str) -> str:
    main, _, sub = resource.partition("/")
    qualified = f"{main}.{group}" if group else main
    return f"{qualified}/{sub}" if sub else qualified


@pytest.mark.timeout(300)
async def test_every_service_account_may_do_what_the_table_grants_and_nothing_sensitive(
    cluster: RealCluster, applied: list[dict[str, Any]]
) -> None:
    cp = cluster.control_plane
    for account, grants in PERMISSIONS.items():
        for grant in grants:
            if grant[1] == "bound":
                continue  # a role the cluster provides: its contents are the cluster's
            namespace, group, resource, verb, name = grant
            where = "" if namespace == "*" else namespace
            target = _resource(group, resource)
            assert can_i(cp, account, verb, target, where, "" if name == "*" else name), (account, grant)
        for verb, resource, namespace in NEVER:
            if account == "gpuledger-scheduler" and (verb, resource) in SCHEDULERS_OWN:
                continue
            assert not can_i(cp, account, verb, resource, namespace), (account, verb, resource)
    # Beyond the table: what each one must not have, given what it does have.
    assert not can_i(cp, "gpuledger-allocator", "patch", "pods", NAMESPACE)
    assert not can_i(cp, "gpuledger-placement", "patch", "nodes", "")
    assert not can_i(cp, "gpuledger-inventory", "patch", "pods", NAMESPACE)
    assert not can_i(cp, "gpuledger-inventory", "create", "pods/binding", NAMESPACE)
    assert not can_i(cp, "gpuledger-nats", "get", "pods", NAMESPACE)


@contextlib.asynccontextmanager
async def inventory_of(cluster: RealCluster, node: str, bound: bool = True) -> AsyncIterator[KubeApi]:
    """The API as the inventory of ``node`` sees it: a token of its service account bound to a pod
    of that account on ``node`` (as the projected token in the node DaemonSet's inventory container).
    Each probe pod has a name of its own: kwok deletes pods by name alone, and a delete left over
    for an earlier probe of the same name removed this one (its token was then refused)."""
    assert cluster.api is not None
    name = f"inventory-probe-{node}-{secrets.token_hex(3)}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "serviceAccountName": "gpuledger-inventory",
            "nodeName": node,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "probe", "image": "none"}],
        },
    }
    made = await cluster.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    spec: dict[str, Any] = {"expirationSeconds": 600}
    if bound:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": made["metadata"]["uid"]}
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/gpuledger-inventory/token"
    token = await cluster.api.create(
        path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    )
    assert cluster.control_plane.access is not None
    access = Access(cluster.control_plane.access.server, cluster.control_plane.access.ca_pem, token["status"]["token"])
    try:
        async with KubeApi(access) as api:
            yield api
    finally:
        with contextlib.suppress(ApiError):
            await cluster.api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", grace_s=0)


async def label(api: KubeApi, node: str, labels: dict[str, str | None]) -> None:
    await api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": labels}})


async def refused(api: KubeApi, node: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as caught:
        await api.patch(f"/api/v1/nodes/{node}", body)
    assert caught.value.status in (403, 422), caught.value
    return str(caught.value)


async def policy_in_force(cluster: RealCluster, api: KubeApi) -> None:
    """A new policy takes effect once the API server has loaded it: wait until it refuses."""
    assert cluster.api is not None
    admin = cluster.api

    async def refusing() -> bool:
        try:
            await label(api, OWN, {"e2e-policy-probe": "x"})
        except ApiError as err:
            if err.status in (403, 422):
                return True
            raise  # another refusal (a token not yet valid, say): named if it lasts
        await label(admin, OWN, {"e2e-policy-probe": None})
        return False

    await wait_for(refusing, 30, "the inventory's admission policy in force", 0.5)


@pytest.mark.timeout(180)
async def test_the_inventory_may_change_only_its_own_nodes_gpuledger_labels(
    cluster: RealCluster, applied: list[dict[str, Any]]
) -> None:
    async with inventory_of(cluster, OWN) as api:
        await policy_in_force(cluster, api)
        await label(api, OWN, {"gpuledger.io/e2e-probe": "yes"})  # its own node, its own label
        await label(api, OWN, {"gpuledger.io/e2e-probe": None})
        why = await refused(api, OTHER, {"metadata": {"labels": {"gpuledger.io/e2e-probe": "yes"}}})
        assert f"gpuledger-inventory of node {OWN} may change only its own Node, not {OTHER}" in why
        why = await refused(api, OWN, {"metadata": {"labels": {"team": "someone-elses"}}})
        assert "only gpuledger.io/ labels" in why
        why = await refused(api, OWN, {"metadata": {"labels": {"kubernetes.io/hostname": None}}})
        assert "only gpuledger.io/ labels" in why
        why = await refused(api, OWN, {"spec": {"unschedulable": True}})
        assert "not a Node's spec or annotations" in why
        why = await refused(api, OWN, {"metadata": {"annotations": {"note": "x"}}})
        assert "not a Node's spec or annotations" in why
    assert cluster.api is not None
    other = (await cluster.api.get(f"/api/v1/nodes/{OTHER}"))["metadata"].get("labels", {})
    assert "gpuledger.io/e2e-probe" not in other
    async with inventory_of(cluster, OWN, bound=False) as unbound:
        why = await refused(unbound, OWN, {"metadata": {"labels": {"gpuledger.io/e2e-probe": "yes"}}})
        assert "not bound to a pod on a node" in why


def resource_slice(node: str, driver: str = "gpu.gpuledger.io") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"e2e-probe-{node}-{driver.split('.')[0]}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


@pytest.mark.timeout(180)
async def test_the_inventory_may_write_only_its_own_nodes_slices_of_our_driver(
    cluster: RealCluster, applied: list[dict[str, Any]]
) -> None:
    slices = "/apis/resource.k8s.io/v1/resourceslices"
    async with inventory_of(cluster, OWN) as api:
        await policy_in_force(cluster, api)
        own = resource_slice(OWN)
        await api.create(slices, own)
        await api.delete(f"{slices}/{own['metadata']['name']}")
        for slice_ in (resource_slice(OTHER), resource_slice(OWN, "gpu.example.com")):
            with pytest.raises(ApiError) as caught:
                await api.create(slices, slice_)
            assert caught.value.status in (403, 422)
            assert "gpuledger-inventory" in str(caught.value) and "may write only ResourceSlices" in str(caught.value)


@pytest.mark.timeout(180)
async def test_the_central_workloads_pass_pod_security_restricted(cluster: RealCluster) -> None:
    cp = cluster.control_plane
    assert cluster.api is not None
    ns = "e2e-pod-security"
    await cluster.api.create(
        "/api/v1/namespaces",
        {"metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    try:
        rendered = [o for o in yaml.safe_load_all(cp.kubectl("kustomize", str(BASE)).stdout) if o]
        checked = set()
        for workload in rendered:
            if workload["kind"] not in ("Deployment", "StatefulSet", "DaemonSet"):
                continue
            spec = dict(workload["spec"]["template"]["spec"])
            claims = [
                {"name": c["metadata"]["name"], "emptyDir": {}}
                for c in workload["spec"].get("volumeClaimTemplates", [])
            ]
            spec["volumes"] = [*spec.get("volumes", []), *claims]  # a StatefulSet's volumes from its claims
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "psa-"}, "spec": spec}
            path = f"/api/v1/namespaces/{ns}/pods?dryRun=All"
            name = workload["metadata"]["name"]
            if workload["kind"] == "DaemonSet":  # the node agents: root and kubelet's host paths (docs/security.md)
                with pytest.raises(ApiError) as caught:
                    await cluster.api.create(path, pod)
                assert "violates PodSecurity" in str(caught.value), name
                continue
            await cluster.api.create(path, pod)
            checked.add(name)
        assert checked >= {"gpuledger-allocator", "gpuledger-placement", "gpuledger-scheduler", "gpuledger-nats"}
    finally:
        with contextlib.suppress(ApiError):
            await cluster.api.delete(f"/api/v1/namespaces/{ns}")


@contextlib.asynccontextmanager
async def placement_of(cluster: RealCluster) -> AsyncIterator[KubeApi]:
    """The API as placement's service account sees it (a token of its own)."""
    assert cluster.api is not None and cluster.control_plane.access is not None
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/gpuledger-placement/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    token = await cluster.api.create(path, body)
    access = cluster.control_plane.access
    async with KubeApi(Access(access.server, access.ca_pem, token["status"]["token"])) as api:
        yield api


@pytest.mark.timeout(180)
async def test_placement_may_patch_a_pod_only_for_its_annotations_and_its_own_gate(
    cluster: RealCluster, applied: list[dict[str, Any]]
) -> None:
    """RBAC lets placement patch any pod; the policy lets it write its gpuledger.io/ annotations and
    lift its gate gpuledger.io/allocate, and nothing else (a gated pod's node selector is mutable:
    a compromised placement must not steer it)."""
    assert cluster.api is not None
    ns, name = "placement-probe", f"gated-{secrets.token_hex(3)}"
    with contextlib.suppress(ApiError):
        await cluster.api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    gated = {  # its claim never comes: the stack's own placement keeps the gate while it waits for it
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "probe"}},
        "spec": {
            "schedulingGates": [{"name": "example.com/other"}, {"name": "gpuledger.io/allocate"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "never-created"}],
            "containers": [{"name": "probe", "image": "none"}],
        },
    }
    await cluster.api.create(f"/api/v1/namespaces/{ns}/pods", gated)
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    json_patch = "application/json-patch+json"

    async def refused(body: Any, content_type: str = "application/merge-patch+json") -> str:
        with pytest.raises(ApiError) as caught:
            await api.patch(path, body, content_type)
        assert caught.value.status in (403, 422), caught.value
        return str(caught.value)

    async with placement_of(cluster) as api:

        async def in_force() -> bool:
            try:
                await api.patch(path, {"metadata": {"labels": {"app": "steered"}}})
            except ApiError as err:
                if err.status in (403, 422) and "gpuledger-placement" in str(err):
                    return True
                raise
            await cluster.api.patch(path, {"metadata": {"labels": {"app": "probe"}}})  # type: ignore[union-attr]
            return False

        await wait_for(in_force, 30, "placement's pod policy in force", 0.5)
        await api.patch(path, {"metadata": {"annotations": {"gpuledger.io/allocation": "a-1"}}})
        assert "only gpuledger.io/ annotations" in await refused({"metadata": {"annotations": {"note": "x"}}})
        assert "only gpuledger.io/ annotations" in await refused({"metadata": {"labels": {"app": "steered"}}})
        why = await refused({"spec": {"nodeSelector": {"kubernetes.io/hostname": OTHER}}})
        assert "may not change a pod's containers, node selector" in why
        other = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": "example.com/other"},
                 {"op": "remove", "path": "/spec/schedulingGates/0"}]  # fmt: skip
        assert "only its own scheduling gate" in await refused(other, json_patch)
        ours = [{"op": "test", "path": "/spec/schedulingGates/1/name", "value": "gpuledger.io/allocate"},
                {"op": "remove", "path": "/spec/schedulingGates/1"}]  # fmt: skip
        await api.patch(path, ours, json_patch)
    found = await cluster.api.get(path)
    assert [g["name"] for g in found["spec"]["schedulingGates"]] == ["example.com/other"]
    assert found["metadata"]["annotations"]["gpuledger.io/allocation"] == "a-1"
    assert found["metadata"]["labels"] == {"app": "probe"} and not found["spec"].get("nodeSelector")
    await cluster.api.delete(path, grace_s=0)
