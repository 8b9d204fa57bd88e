"""Bring the whole stack up on a simulated fleet, in order, and take it down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gpuledger_common.allocator_client import allocator, cluster_nodes
from gpuledger_common.natsauth import Role
from gpuledger_common.natscreds import NatsCredentials
from gpuledger_dev.extender_pki import ExtenderPki
from gpuledger_dev.fake_cluster import FakeCluster
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.natsserver import NatsServer, free_port
from gpuledger_dev.processes import Supervisor
from gpuledger_dev.real_cluster import BOTH, MODES, RealCluster
from gpuledger_dev.secure_nats import SecureNats, secure_nats

Say = Callable[[str], None]
READY_S = 90.0
KUBERNETES = ("fake", "real")
GUARD = "4:32"  # GPULEDGER_GUARD of deploy/kubernetes/base
Cluster = FakeCluster | RealCluster


@dataclass
class Stack:
    fleet: Fleet
    nats_url: str
    grpc: str
    dashboard: str
    extender: str
    cluster: Cluster
    supervisor: Supervisor
    nats: NatsServer
    operator: NatsCredentials  # for gpuledger health against this stack
    pki: ExtenderPki  # the extender's certificates: kube-scheduler's client one among them
    placement_ops: str  # placement's /healthz, /readyz and /metrics (plain HTTP)


async def wait_until(check: Callable[[], Awaitable[bool]], what: str, supervisor: Supervisor) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_S
    while loop.time() < deadline:
        supervisor.check()
        with contextlib.suppress(Exception):
            if await check():
                return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{what} not ready within {READY_S:g}s (logs in {supervisor.run_dir})")


async def _http_ok(url: str) -> bool:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http, http.get(url) as reply:
        return reply.status == 200


async def _nodes_in_ledger(grpc: str, count: int) -> bool:
    async with allocator(grpc) as api:
        return len(await cluster_nodes(api)) >= count


@contextlib.asynccontextmanager
async def running_stack(
    fleet: Fleet,
    dashboard_port: int,
    grpc_port: int,
    say: Say,
    kubernetes: str = "fake",
    mode: str = "classic",
    real_node: str = "",
    topology_policy: str = "none",
    dra_allocation: str = "ledger",
) -> AsyncIterator[Stack]:
    """The whole stack; ``kubernetes`` is ``sim`` (simulated API server, scheduler and kubelets) or
    ``real`` (a real control plane built from Go modules, kwok nodes and simulated kubelets);
    ``mode`` ``dra`` (real only) runs every node in DRA mode (docs/dra.md); ``real_node`` (real
    only) names the fleet's node that runs a real kubelet and container runtime, with
    ``topology_policy`` as its Topology Manager policy; ``dra_allocation``: in DRA mode, whether
    the ledger allocates the claims of the stack's pods (``ledger``, mode C) or kube-scheduler
    does and the ledger commits them (``scheduler``, mode B)."""
    if real_node and kubernetes != "real":
        raise ValueError(f"a real node ({real_node}) needs the real control plane, not {kubernetes}")
    if kubernetes not in KUBERNETES:
        raise ValueError(f"kubernetes must be one of {'|'.join(KUBERNETES)}, got {kubernetes!r}")
    if mode not in (*MODES, BOTH) or (mode != "classic" and kubernetes != "real"):
        raise ValueError(f"mode must be classic, or dra with the real control plane; got {mode!r} on {kubernetes}")
    run_dir = Path(tempfile.mkdtemp(prefix="gl-"))  # short: unix socket paths stay under 108 bytes
    supervisor = Supervisor(run_dir)
    names = [str(n.node.name) for n in fleet.nodes]
    cluster: Cluster = (
        FakeCluster(run_dir, names)
        if kubernetes == "fake"
        else RealCluster(run_dir, fleet, mode, real_node, topology_policy, dra_allocation)
    )
    say(f"logs and sockets in {run_dir}")
    try:
        async with secure_nats(names) as nats:  # TLS, and a user per role and node, as deployed
            say(f"nats-server with JetStream, TLS and a user per role and node on {nats.url}")
            if isinstance(cluster, RealCluster):
                say("starting the control plane (binaries are built from Go modules on first use: minutes)")
            kubeconfig = await cluster.start()
            say(_cluster_started(cluster, len(names)))
            stack = await _start_services(fleet, nats, kubeconfig, cluster, supervisor, dashboard_port, grpc_port, say)
            yield stack
    finally:
        await supervisor.stop()
        await cluster.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        say("stopped every process; removed sockets and logs")


def kubectl_of(cluster: RealCluster) -> str:
    """The control plane's own kubectl (built with it; a fresh machine has none on PATH)."""
    bins = cluster.control_plane.bins
    return str(bins.kubectl) if bins is not None else "kubectl"


def _cluster_started(cluster: Cluster, kubelets: int) -> str:
    if isinstance(cluster, FakeCluster):
        return f"simulated API server on {cluster.apiserver.url}, {kubelets} simulated kubelet(s)"
    access = cluster.control_plane.access
    server = access.server if access else "?"
    kwok = kubelets - bool(cluster.real_node)
    real = f", and {cluster.real_node} a real node (kubelet and containerd)" if cluster.real_node else ""
    return (
        f"kube-apiserver on {server}, kube-controller-manager, kwok with {kwok} node(s) and simulated "
        f"kubelets{real}; try: {kubectl_of(cluster)} --kubeconfig {cluster.kubeconfig} get pods -A -o wide"
    )


def _nats_flags(nats: SecureNats, role: Role, node: str = "") -> list[str]:
    creds = nats.credentials(role, node)
    return [
        "--nats-url",
        nats.url,
        "--nats-user",
        creds.user,
        "--nats-password-file",
        creds.password_file,
        "--nats-ca-file",
        creds.ca_file,
    ]


def _guard(cluster: Cluster) -> list[str]:
    """The guard as the manifests set it, where the API server lists and watches Nodes (the real one)."""
    return ["--guard", GUARD] if isinstance(cluster, RealCluster) else []


def _inventory_kube(cluster: Cluster, kubeconfig: Path) -> list[str]:
    """The simulated API server has no Node objects to label; the real one has (and in DRA mode the
    inventory publishes the node's ResourceSlices there)."""
    if isinstance(cluster, FakeCluster):
        return ["--kube", "off"]
    dra = ["--mode", "dra"] if cluster.dra else []
    return ["--kube", "kubeconfig", "--kubeconfig", str(kubeconfig), *dra]


def _plugins(cluster: Cluster, nats: SecureNats, node: str, kubeconfig: Path) -> dict[str, list[str]]:
    """The node's plugin shims by name: the device plugin, the DRA kubelet plugin, or both."""
    dra = isinstance(cluster, RealCluster) and cluster.dra
    classic = not isinstance(cluster, RealCluster) or cluster.classic
    found = {f"plugin-{node}": _classic_plugin(cluster, nats, node)} if classic else {}
    if dra:
        found[f"dra-plugin-{node}" if classic else f"plugin-{node}"] = _dra_plugin(cluster, nats, node, kubeconfig)
    return found


def _dra_plugin(cluster: Cluster, nats: SecureNats, node: str, kubeconfig: Path) -> list[str]:
    assert isinstance(cluster, RealCluster)
    return [
        "--mode", "dra", "--node", node, *_nats_flags(nats, Role.PLUGIN, node),
        "--registry-dir", str(cluster.registry_dir(node)), "--plugin-dir", str(cluster.dra_plugin_dir(node)),
        "--cdi-dir", str(cluster.cdi_dir(node)), "--kubeconfig", str(kubeconfig),
        "--http-host", "127.0.0.1", "--http-port", "0", *cluster.dra_plugin_flags(node),
    ]  # fmt: skip


def _classic_plugin(cluster: Cluster, nats: SecureNats, node: str) -> list[str]:
    real = cluster.plugin_flags(node) if isinstance(cluster, RealCluster) else []
    return [
        "--node", node, *_nats_flags(nats, Role.PLUGIN, node),
        "--device-plugin-dir", str(cluster.plugin_dir(node)),
        "--pod-resources-socket", str(cluster.pod_resources(node)),
        "--http-host", "127.0.0.1", "--http-port", "0", *real,
    ]  # fmt: skip


async def _start_services(
    fleet: Fleet,
    nats: SecureNats,
    kubeconfig: Path,
    cluster: Cluster,
    supervisor: Supervisor,
    dashboard_port: int,
    grpc_port: int,
    say: Say,
) -> Stack:
    local = ["--http-host", "127.0.0.1"]
    grpc = f"127.0.0.1:{grpc_port}"
    nats_url = nats.url
    await supervisor.start(
        "allocator",
        "gpuledger_allocator",
        [
            *_nats_flags(nats, Role.ALLOCATOR),
            "--grpc-host",
            "127.0.0.1",
            "--grpc-port",
            str(grpc_port),
            *local,
            "--http-port",
            str(dashboard_port),
            "--kube",
            "kubeconfig",
            "--kubeconfig",
            str(kubeconfig),
            "--reconcile-interval-s",
            "1",
            "--reconcile-grace-s",
            "1",
        ],
    )
    placement_port, extender_port = free_port(), free_port()
    pki = ExtenderPki(supervisor.run_dir / "extender-pki")  # kube-scheduler calls it with its certificate
    await supervisor.start(
        "placement",
        "gpuledger_placement",
        [
            *_nats_flags(nats, Role.PLACEMENT),
            *local,
            "--http-port",
            str(placement_port),
            *pki.placement_flags(),
            "--extender-port",
            str(extender_port),
            *_guard(cluster),
            "--kube",
            "kubeconfig",
            "--kubeconfig",
            str(kubeconfig),
        ],
    )
    for member in fleet.nodes:
        node = member.node.name
        await supervisor.start(
            f"inventory-{node}",
            "gpuledger_inventory",
            [
                "--fake-fleet",
                fleet.path,
                "--node",
                node,
                *_nats_flags(nats, Role.INVENTORY, node),
                *local,
                "--http-port",
                "0",
                *_inventory_kube(cluster, kubeconfig),
            ],
        )
        for name, argv in _plugins(cluster, nats, node, kubeconfig).items():
            await supervisor.start(name, "gpuledger_plugin", argv)
    started = ", ".join(f"{p.name} (pid {p.process.pid})" for p in supervisor.services if p.process)
    say(f"started {started}")
    await wait_until(lambda: _nodes_in_ledger(grpc, len(fleet.nodes)), "every node in the ledger", supervisor)
    say("every node's inventory is in the ledger")
    extender = f"https://127.0.0.1:{extender_port}/gpuledger"
    await wait_until(lambda: _http_ok(f"http://127.0.0.1:{placement_port}/readyz"), "placement", supervisor)
    await cluster.use_extender(extender, pki)
    say(f"placement ready; the extender is {extender}")
    await wait_until(cluster.devices_ready, "every plugin registered with its kubelet", supervisor)
    say("every plugin shim registered with its kubelet and listed its devices")
    dashboard = f"http://127.0.0.1:{dashboard_port}/"
    operator = nats.credentials(Role.OPERATOR)
    ops = f"http://127.0.0.1:{placement_port}"
    return Stack(fleet, nats_url, grpc, dashboard, extender, cluster, supervisor, nats.server, operator, pki, ops)
