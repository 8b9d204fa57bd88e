"""What gpuledger writes into the cluster and what it ships for it, checked by the real API server:
the inventory's Node labels (a patch of the Node, seen by kubectl), and the kustomize overlays
applied with server-side dry-run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import POLL_S
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


@pytest.mark.timeout(120)
async def test_the_inventory_labels_its_node_through_the_real_api(cluster: RealCluster, api: KubeApi) -> None:
    async def labelled() -> dict[str, str] | None:
        labels = (await api.get("/api/v1/nodes/h100-0"))["metadata"].get("labels", {})
        return labels if any(k.startswith("gpuledger.io/gpu.") for k in labels) else None

    labels = await wait_for(labelled, 60, "gpuledger labels on h100-0", POLL_S)
    seen = json.loads(cluster.control_plane.kubectl("get", "node", "h100-0", "-o", "json").stdout)
    assert {k: v for k, v in seen["metadata"]["labels"].items() if k.startswith("gpuledger.io/")} == {
        k: v for k, v in labels.items() if k.startswith("gpuledger.io/")
    }
    assert seen["metadata"]["labels"].get("gpuledger.io/gpu.count") == "8", seen["metadata"]["labels"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("overlay", ["dev", "production"])
async def test_an_overlay_applies_with_server_side_dry_run(cluster: RealCluster, overlay: str) -> None:
    # A server-side dry run creates nothing, so the namespace the objects go into must exist already.
    cluster.control_plane.kubectl("create", "namespace", "gpuledger", check=False)
    done = cluster.control_plane.kubectl(
        "apply", "--server-side", "--dry-run=server", "-k", str(DEPLOY / "overlays" / overlay), check=False
    )
    assert done.returncode == 0, done.stderr
    assert "serverside-applied" in done.stdout, done.stdout


@pytest.mark.timeout(180)
async def test_an_overlay_with_dra_mode_applies_with_server_side_dry_run(cluster: RealCluster, tmp_path: Path) -> None:
    """deploy/kubernetes/dra listed beside the base, as its kustomization says an overlay does: the
    DeviceClasses, the claims controller's RBAC and the DRA nodes' DaemonSet, with the overlay's
    image and the base's (hash-named) settings."""
    root = os.path.relpath(DEPLOY, tmp_path)  # noqa: ASYNC240 - string arithmetic on two paths
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {root}/base\n  - {root}/dra\nimages:\n  - name: gpuledger\n    newTag: 0.1.0\n"
    )
    cp = cluster.control_plane
    cp.kubectl("create", "namespace", "gpuledger", check=False)
    rendered = cp.kubectl("kustomize", "--load-restrictor", "LoadRestrictionsNone", str(tmp_path)).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    dra = next(o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "gpuledger-node-dra")
    settings = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    for container in dra["spec"]["template"]["spec"]["containers"]:
        assert container["image"] == "gpuledger:0.1.0"
        assert all(e["configMapRef"]["name"] in settings for e in container["envFrom"])
    done = cp.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input_text=rendered, check=False)
    assert done.returncode == 0, done.stderr
    assert "deviceclass.resource.k8s.io/mps.gpu.gpuledger.io serverside-applied" in done.stdout, done.stdout
