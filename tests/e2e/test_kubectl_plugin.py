"""``kubectl gpuledger`` on the real control plane: the real kubectl finds the plugin on PATH, and the
plugin reaches the stack's allocator through the real kube-apiserver's service proxy, as a user who
holds only the shipped Role ``gpuledger-viewer`` (deploy/kubernetes/base/viewer.yaml, applied as is).

The API server proxies a Service only to an address of its Endpoints (v1 Endpoints: what the service
proxy reads, not EndpointSlices) that is a Pod's IP, never to loopback. The stack's allocator is a
local process listening on 127.0.0.1, so the test gives the Service ``gpuledger-allocator`` no selector
and Endpoints that name this host's non-loopback address, on which a plain TCP relay in the test
passes each connection to the allocator's HTTP port; a Pod that no scheduler or kubelet takes stands
for the allocator's pod, with that address as its IP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
import yaml

from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.controlplane.cluster import advertise_address
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import POLL_S, ledger, namespace, pod, running, share
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

VIEWER = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "base" / "viewer.yaml"
GL = "gpuledger"  # the plugin's defaults: the namespace and Service of deploy/kubernetes
SERVICE = "gpuledger-allocator"
STAND_IN = "gpuledger-allocator-stand-in"
TEAM_A, TEAM_B = "e2e-kubectl-a", "e2e-kubectl-b"
NODE = "v100-0"
RUN_S = 60.0


@contextlib.asynccontextmanager
async def relay(host: str, target_port: int) -> AsyncIterator[int]:
    """A TCP relay on ``host`` (a free port, yielded) to 127.0.0.1:``target_port``."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    server = await asyncio.start_server(each, host, 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@dataclass(frozen=True)
class Proxied:
    """The Service in place, and a kubeconfig for each user: ``viewer`` holds gpuledger-viewer,
    ``stranger`` nothing; both have TEAM_A as their context's namespace."""

    viewer: Path
    stranger: Path
    address: str
    port: int


def restricted_pod(name: str) -> dict[str, Any]:
    """A Pod no scheduler takes (and so no kubelet runs), compliant with Pod Security ``restricted``."""
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": SERVICE}},
        "spec": {
            "schedulerName": "e2e-no-scheduler",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "allocator", "image": "gpuledger", "securityContext": security}],
        },
    }


async def create(api: KubeApi, path: str, body: dict[str, Any]) -> None:
    """Create, replacing what an earlier run of this module may have left."""
    name = body["metadata"]["name"]
    with contextlib.suppress(ApiError):
        await api.call("DELETE", f"{path}/{name}", params={"gracePeriodSeconds": "0"})
    await wait_for(lambda: _absent(api, f"{path}/{name}"), 30, f"{path}/{name} gone", POLL_S)
    await api.create(path, body)


async def _absent(api: KubeApi, path: str) -> bool:
    try:
        await api.get(path)
    except ApiError as err:
        return err.status == 404
    return False


async def user_kubeconfig(api: KubeApi, cluster: RealCluster, account: str, path: Path) -> Path:
    """A kubeconfig for ``account`` (a service account in TEAM_A) whose context's namespace is TEAM_A."""
    await create(api, f"/api/v1/namespaces/{TEAM_A}/serviceaccounts", {"metadata": {"name": account}})
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    token = (await api.create(f"/api/v1/namespaces/{TEAM_A}/serviceaccounts/{account}/token", request))["status"]
    access = cluster.control_plane.access
    assert access is not None
    ca = path.with_suffix(".ca")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": access.server, "certificate-authority": str(ca)}}],
        "users": [{"name": account, "user": {"token": token["token"]}}],
        "contexts": [{"name": account, "context": {"cluster": "e2e", "user": account, "namespace": TEAM_A}}],
        "current-context": account,
    }
    write_files({ca: access.ca_pem, path: yaml.safe_dump(config).encode()})
    return path


def write_files(contents: dict[Path, bytes]) -> None:
    for path, data in contents.items():
        path.write_bytes(data)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def proxied(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Proxied]:
    assert isinstance(stack.cluster, RealCluster) and stack.cluster.api is not None
    cluster, api = stack.cluster, stack.cluster.api
    address = advertise_address()
    if address == "192.0.2.1":
        pytest.fail("this host has no non-loopback IPv4 address: the API server cannot proxy to the allocator")
    for ns in (GL, TEAM_A):
        with contextlib.suppress(ApiError):
            await api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    cluster.control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(VIEWER))
    dashboard_port = int(urlsplit(stack.dashboard).port or 0)
    async with relay(address, dashboard_port) as port:
        await create(api, f"/api/v1/namespaces/{GL}/pods", restricted_pod(STAND_IN))
        status = {"status": {"podIP": address, "podIPs": [{"ip": address}]}}
        await api.patch(f"/api/v1/namespaces/{GL}/pods/{STAND_IN}/status", status)
        service = {
            "metadata": {"name": SERVICE},
            "spec": {"ports": [{"name": "http", "port": 8081, "targetPort": port}]},
        }
        await create(api, f"/api/v1/namespaces/{GL}/services", service)
        await create(api, f"/api/v1/namespaces/{GL}/endpoints", endpoints(address, port))
        binding = {
            "metadata": {"name": "gpuledger-viewer-e2e"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpuledger-viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": TEAM_A}],
        }
        await create(api, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{GL}/rolebindings", binding)
        directory = tmp_path_factory.mktemp("kubectl-plugin")
        viewer = await user_kubeconfig(api, cluster, "viewer", directory / "viewer.kubeconfig")
        stranger = await user_kubeconfig(api, cluster, "stranger", directory / "stranger.kubeconfig")
        try:
            yield Proxied(viewer, stranger, address, port)
        finally:
            for path in (
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{GL}/rolebindings/gpuledger-viewer-e2e",
                f"/api/v1/namespaces/{GL}/endpoints/{SERVICE}",
                f"/api/v1/namespaces/{GL}/services/{SERVICE}",
                f"/api/v1/namespaces/{GL}/pods/{STAND_IN}",
                f"/api/v1/namespaces/{TEAM_A}",
            ):
                with contextlib.suppress(ApiError):
                    await api.delete(path, grace_s=0)


def endpoints(address: str, port: int) -> dict[str, Any]:
    target = {"kind": "Pod", "namespace": GL, "name": STAND_IN}
    subset = {"addresses": [{"ip": address, "targetRef": target}], "ports": [{"name": "http", "port": port}]}
    return {"metadata": {"name": SERVICE}, "subsets": [subset]}


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str


async def kubectl_gpuledger(cluster: RealCluster, kubeconfig: Path, *args: str) -> Done:
    """``kubectl gpuledger ARGS`` by the real kubectl, as the user of ``kubeconfig`` ($KUBECONFIG)."""
    assert cluster.control_plane.bins is not None
    scripts = Path(sys.executable).parent  # where this environment installed kubectl-gpuledger
    if not shutil.which("kubectl-gpuledger", path=str(scripts)):
        pytest.fail(f"no kubectl-gpuledger in {scripts}: install the package into this environment (docs/e2e.md)")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"}
    process = await asyncio.create_subprocess_exec(
        str(cluster.control_plane.bins.kubectl),
        "gpuledger",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), RUN_S)
    assert process.returncode is not None
    return Done(process.returncode, out.decode(), err.decode())


Holding = tuple[str, str, str, str, int, int]  # node, card UUID, namespace, pod, MiB, per-mille


async def ledger_holders(stack: Stack, namespaces: set[str]) -> set[Holding]:
    found: set[Holding] = set()
    for node, book in (await ledger(stack)).items():
        for a in book.live():
            if a.owner.namespace in namespaces:
                found |= {(node, s.uuid, a.owner.namespace, a.owner.name, s.mem_mib, s.core_milli) for s in a.shares()}
    return found


def shown_holders(nodes: list[dict[str, Any]]) -> set[Holding]:
    return {
        (n["name"], c["uuid"], h["owner"]["namespace"], h["owner"]["name"], h["mem_mib"], h["core_milli"])
        for n in nodes
        for c in n["cards"]
        for h in c["holders"]
    }


async def shown_json(cluster: RealCluster, kubeconfig: Path, *args: str) -> dict[str, Any]:
    done = await kubectl_gpuledger(cluster, kubeconfig, *args, "-o", "json")
    assert done.code == 0, done.err
    return dict(json.loads(done.out))


@pytest.mark.timeout(300)
async def test_a_viewer_sees_its_namespaces_pods_on_their_cards_as_the_ledger_holds_them(
    stack: Stack, cluster: RealCluster, proxied: Proxied
) -> None:
    api = cluster.api
    assert api is not None
    async with namespace(api, TEAM_A, stack), namespace(api, TEAM_B, stack):
        pods = {TEAM_A: ["train-0", "train-1"], TEAM_B: ["web-0"]}
        for ns, names in pods.items():
            for name in names:
                await api.create(
                    f"/api/v1/namespaces/{ns}/pods", pod(name, ns, share(1000 if ns == TEAM_A else 2000), node=NODE)
                )
        await asyncio.gather(*(running(api, ns, name) for ns, names in pods.items() for name in names))
        mine = await ledger_holders(stack, {TEAM_A})
        assert {h[3] for h in mine} == set(pods[TEAM_A])

        async def agrees() -> dict[str, Any] | None:  # the allocator's view follows the ledger's events
            found = await shown_json(cluster, proxied.viewer)
            return found if shown_holders(found["nodes"]) == mine else None

        found = await wait_for(agrees, 30, "kubectl gpuledger showing the ledger's holders of the namespace", POLL_S)
        assert found["namespace"] == TEAM_A
        others = await ledger_holders(stack, {TEAM_B})
        for node in found["nodes"]:
            for card in node["cards"]:
                assert card["other_holders"] == sum(1 for h in others if h[1] == card["uuid"]), card

        table = await kubectl_gpuledger(cluster, proxied.viewer)
        assert table.code == 0, table.err
        lines = table.out.splitlines()
        assert lines[0].split()[:2] == ["NODE", "CARD"]
        assert all(f"{TEAM_A}/{name}[app] (1000 MiB" in table.out for name in pods[TEAM_A])
        assert "web-0" not in table.out
        assert lines[-1].startswith(f"namespace {TEAM_A}: 2 holder(s) on ")

        everything = await shown_json(cluster, proxied.viewer, "-A")
        assert everything["namespace"] is None
        assert shown_holders(everything["nodes"]) >= mine | others
        assert {n["name"] for n in everything["nodes"]} == set(await ledger(stack))
        other_ns = await shown_json(cluster, proxied.viewer, "-n", TEAM_B)
        assert shown_holders(other_ns["nodes"]) == others

        # top: each holder's grant, and its use as the status says it (the share audit's, where the
        # node's inventory tells processes' pods; n/m where not); compute use is not measured.
        top = await kubectl_gpuledger(cluster, proxied.viewer, "top")
        assert top.code == 0, top.err
        used = {
            h["owner"]["name"]: "n/m" if h.get("used_mib") is None else str(h["used_mib"])
            for n in (await shown_json(cluster, proxied.viewer))["nodes"]
            for c in n["cards"]
            for h in c["holders"]
        }
        rows = [line.split() for line in top.out.split("\n\n")[0].splitlines()[1:]]
        assert sorted((r[0], r[1], r[3], r[5], r[7]) for r in rows) == [
            (TEAM_A, name, NODE, "1000", used[name]) for name in pods[TEAM_A]
        ]
        top_json = await shown_json(cluster, proxied.viewer, "top")
        assert [h["used"]["core_milli"] for h in top_json["holders"]] == [None, None]
        assert "n/m: not measured." in top.out


@pytest.mark.timeout(120)
async def test_a_user_without_the_role_is_told_which_permission_and_role(
    cluster: RealCluster, proxied: Proxied
) -> None:
    done = await kubectl_gpuledger(cluster, proxied.stranger)
    assert done.code == 4, (done.out, done.err)
    assert f'User "system:serviceaccount:{TEAM_A}:stranger" cannot get resource "services/proxy"' in done.err
    assert f"needs `get` on services/proxy of the service {SERVICE} in the namespace {GL}" in done.err
    assert "The Role gpuledger-viewer there grants it" in done.err
    assert done.out == ""
    # The Role opens the allocator's HTTP port and nothing else through the proxy.
    grpc = await kubectl_gpuledger(cluster, proxied.viewer, "--gpuledger-port", "grpc")
    assert grpc.code == 4 and 'cannot get resource "services/proxy"' in grpc.err, grpc.err


@pytest.mark.timeout(120)
async def test_an_allocator_that_cannot_be_reached_is_said(
    stack: Stack, cluster: RealCluster, proxied: Proxied
) -> None:
    api = cluster.api
    assert api is not None
    path = f"/api/v1/namespaces/{GL}/endpoints/{SERVICE}"
    async with relay(proxied.address, 1) as closed:
        pass  # a port on this address where nothing listens any more
    await api.patch(path, endpoints(proxied.address, closed))
    try:
        done = await kubectl_gpuledger(cluster, proxied.viewer)
    finally:
        await api.patch(path, endpoints(proxied.address, proxied.port))
    assert done.code == 5, (done.out, done.err)
    assert f"the allocator cannot be reached through the API server (service {SERVICE} in namespace {GL}" in done.err
    assert "connection refused" in done.err, done.err
    assert (await kubectl_gpuledger(cluster, proxied.viewer)).code == 0
