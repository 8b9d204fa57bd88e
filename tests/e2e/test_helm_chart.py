"""The Helm chart installed by the real helm on a real kube-apiserver (1.36.3) of its own: every object
accepted and the release deployed, the pods the controllers make from its workloads admitted (Pod
Security, the guard's admission policy), an upgrade that keeps the generated credentials, and an
uninstall that leaves none of the release's objects behind.

No image runs here (no registry, no node for the pods): what is checked is what the API server
decides. helm is the one ``python -m tests.support.helm`` builds (tox -e e2e builds it first)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger_dev.controlplane.cluster import DEFAULT_CONTROLLERS, ControlPlane
from tests.helm.chart import NAMESPACE, run_helm, values_file
from tests.support.chart import CHART
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

CONTROLLERS = (*DEFAULT_CONTROLLERS, "deployment-controller", "statefulset-controller", "daemonset-controller")
VALUES: dict[str, Any] = {
    "nodePools": [{"name": "node", "mode": "classic"}, {"name": "node-dra", "mode": "dra"}],
    "guard": {"tolerationPolicy": True},
    "credentials": {"generate": True, "nodes": ["gpu-1", "gpu-2"]},
    "nats": {"replicas": 3},
}


@pytest.fixture(scope="module")
def control_plane() -> Iterator[ControlPlane]:
    """A control plane of this module's own: the release's cluster-wide objects (RBAC, admission
    policies, DeviceClasses) must not meet those other tests apply."""
    workdir = Path(tempfile.mkdtemp(prefix="gl-helm-"))
    with ControlPlane(workdir, controllers=CONTROLLERS, kwok=False) as cp:
        yield cp


@pytest.fixture(scope="module")
def kubeconfig(control_plane: ControlPlane) -> Path:
    assert control_plane.admin_kubeconfig is not None
    return control_plane.admin_kubeconfig


def manifest(kubeconfig: Path) -> list[dict[str, Any]]:
    out = run_helm("get", "manifest", "gpuledger", "-n", NAMESPACE, kubeconfig=kubeconfig).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def exists(cp: ControlPlane, obj: dict[str, Any]) -> bool:
    ref = [f"{obj['kind']}.{obj['apiVersion'].split('/')[0]}" if "/" in obj["apiVersion"] else obj["kind"]]
    namespace = obj["metadata"].get("namespace")
    args = ["get", *ref, obj["metadata"]["name"], "--ignore-not-found", "-o", "name"]
    done = cp.kubectl(*args, *(["-n", namespace] if namespace else []))
    return bool(done.stdout.strip())


def secrets(cp: ControlPlane) -> dict[str, dict[str, str]]:
    listed = json.loads(cp.kubectl("get", "secrets", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    return {s["metadata"]["name"]: s.get("data", {}) for s in listed if s["type"] != "helm.sh/release.v1"}


@pytest.mark.timeout(420)
async def test_the_chart_installs_upgrades_and_uninstalls_on_a_real_api_server(
    control_plane: ControlPlane, kubeconfig: Path, tmp_path: Path
) -> None:
    cp = control_plane
    cp.kubectl("create", "namespace", NAMESPACE)
    cp.kubectl(
        "label",
        "namespace",
        NAMESPACE,
        "pod-security.kubernetes.io/enforce=privileged",
        "pod-security.kubernetes.io/warn=baseline",
    )
    values = values_file(tmp_path, VALUES)
    run_helm("install", "gpuledger", str(CHART), "-n", NAMESPACE, "-f", str(values), kubeconfig=kubeconfig)
    status = json.loads(run_helm("status", "gpuledger", "-n", NAMESPACE, "-o", "json", kubeconfig=kubeconfig).stdout)
    assert status["info"]["status"] == "deployed", status["info"]

    objects = manifest(kubeconfig)
    kinds = {o["kind"] for o in objects}
    assert {"StatefulSet", "Deployment", "DaemonSet", "ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"} <= kinds
    assert {"DeviceClass", "Secret", "NetworkPolicy", "PodDisruptionBudget"} <= kinds
    missing = [(o["kind"], o["metadata"]["name"]) for o in objects if not exists(cp, o)]
    assert not missing, f"in the release but not in the cluster: {missing}"

    # The controllers make the pods: each is admitted (Pod Security privileged for the namespace,
    # the guard's policy: these tolerate no GPU taint), and waits for a node.
    async def pods() -> dict[str, int] | None:
        listed = json.loads(cp.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)["items"]
        counted: dict[str, int] = {}
        for pod in listed:
            name = pod["metadata"]["labels"]["app.kubernetes.io/name"]
            counted[name] = counted.get(name, 0) + 1
        wanted = {"gpuledger-nats": 3, "gpuledger-allocator": 2, "gpuledger-placement": 2, "gpuledger-scheduler": 2}
        return counted if counted == wanted else None

    await wait_for(pods, 90, "the pods of the chart's StatefulSet and Deployments", 1.0)

    # An upgrade keeps every generated password and certificate (looked up in the cluster).
    before = secrets(cp)
    assert {"gpuledger-nats-passwords", "gpuledger-nats-auth", "gpuledger-nats-tls", "gpuledger-admin-tls"} <= set(
        before
    )
    run_helm("upgrade", "gpuledger", str(CHART), "-n", NAMESPACE, "-f", str(values), kubeconfig=kubeconfig)
    assert secrets(cp) == before
    status = json.loads(run_helm("status", "gpuledger", "-n", NAMESPACE, "-o", "json", kubeconfig=kubeconfig).stdout)
    assert (status["info"]["status"], status["version"]) == ("deployed", 2)

    run_helm("uninstall", "gpuledger", "-n", NAMESPACE, "--wait", "--timeout", "120s", kubeconfig=kubeconfig)

    async def gone() -> bool | None:
        return None if any(exists(cp, o) for o in objects) else True

    await wait_for(gone, 60, "every object of the release deleted", 1.0)
    assert not secrets(cp), "uninstall left Secrets"
    listed = run_helm("list", "-n", NAMESPACE, "-a", "-q", kubeconfig=kubeconfig).stdout
    assert listed.strip() == "", listed
