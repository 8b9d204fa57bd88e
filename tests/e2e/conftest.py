"""The e2e suite: pytest against a real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler with gpuledger's extender, kwok nodes with simulated kubelets), built from Go modules
on first use and started once per session on loopback, with the real gpuledger services as processes.

Every test module here runs in the session's event loop (``pytestmark``): the stack's kubelets live in it."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.controlplane.cluster import Access, ControlPlane
from gpuledger_dev.fleet import Fleet, load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import NatsServer, embedded_nats, free_port
from gpuledger_dev.real_cluster import RealCluster

E2E_FLEET = Path(__file__).with_name("fleet.yaml")


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A bare control plane (no gpuledger services, no scheduler) for tests of the harness itself."""
    workdir = Path(tempfile.mkdtemp(prefix="gl-cp-"))
    with ControlPlane(workdir) as cp:
        yield cp


@pytest.fixture(scope="session")
def fleet() -> Fleet:
    return load_fleet(str(E2E_FLEET))


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def stack(fleet: Fleet) -> AsyncIterator[Stack]:
    """The whole gpuledger stack on the real control plane, as ``gpuledger dev up --kubernetes real`` runs it."""
    async with running_stack(fleet, free_port(), free_port(), _say, "real") as running:
        yield running


@pytest.fixture
def cluster(stack: Stack) -> RealCluster:
    assert isinstance(stack.cluster, RealCluster)
    return stack.cluster


@pytest.fixture
def api(cluster: RealCluster) -> KubeApi:
    assert cluster.api is not None
    return cluster.api


def _say(message: str) -> None:
    print(f"[e2e stack] {message}", flush=True)


@pytest_asyncio.fixture(loop_scope="session")
async def nats_server() -> AsyncIterator[NatsServer]:
    """A nats-server of the test's own."""
    async with embedded_nats() as server:
        yield server


DRA_DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "dra"
ADMISSION = DRA_DEPLOY.parent / "base" / "admission.yaml"
PLACEMENT = DRA_DEPLOY.parent / "base" / "placement.yaml"
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
POD_POLICY = "gpuledger-placement-pod-patches"  # the policy and its binding


@pytest.fixture(scope="session")
def placement_kubeconfig(control_plane: ControlPlane) -> Path:
    """A kubeconfig of placement's service account holding only what a DRA deployment grants it
    (deploy/kubernetes/dra and the base's placement role, applied as shipped, by the real kubectl),
    under the base's policy on its pod patches: the claims controller's, mode C's and preemption's
    writes in the DRA tests prove that they are enough."""
    cp = control_plane
    cp.kubectl("create", "namespace", "gpuledger", check=False)
    cp.kubectl("create", "serviceaccount", "gpuledger-placement", "-n", "gpuledger", check=False)
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(DRA_DEPLOY))
    policy = [o for o in yaml.safe_load_all(ADMISSION.read_text()) if o and o["metadata"]["name"] == POD_POLICY]
    role = [o for o in yaml.safe_load_all(PLACEMENT.read_text()) if o and o["kind"] in RBAC_KINDS]
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=yaml.safe_dump_all(policy + role))
    token = cp.kubectl("create", "token", "gpuledger-placement", "-n", "gpuledger", "--duration=2h").stdout.strip()
    assert cp.access is not None
    return Access(cp.access.server, cp.access.ca_pem, token).kubeconfig(cp.workdir / "placement-dra.kubeconfig")
