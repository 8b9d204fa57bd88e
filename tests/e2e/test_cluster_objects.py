"""What gpuledger writes into the cluster and what it ships for it, checked by the real API server:
the inventory's Node labels (a patch of the Node, seen by kubectl), and the kustomize overlays
applied with server-side dry-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuledger_cli.dev.kubereal import RealCluster
from gpuledger_testing.controlplane.api import KubeApi
from gpuledger_testing.waiting import wait_for
from tests.e2e.helpers import POLL_S

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
