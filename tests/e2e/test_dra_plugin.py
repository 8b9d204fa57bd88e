"""The DRA kubelet plugin (gpuledger-plugin --mode dra) over its unix sockets, as kubelet speaks to
it: the registration handshake, then NodePrepareResources and NodeUnprepareResources (v1 and
v1beta1) for claims that the real kube-scheduler allocated from the inventory's slices (published
without binding conditions: placement's claims controller mirrors each allocation into the
ledger), each checked against the node's ledger: a claim the ledger does not hold is refused."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel

from gpuledger_dev.controlplane.cluster import ControlPlane, plain_scheduler_config
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.slices import DRIVER
from gpuledger_plugin.dra.app import RunningDra, running
from gpuledger_plugin.dra.settings import DraSettings
from gpuledger_proto import pluginregistration as reg
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1 as dra
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_beta
from tests.e2e.dra_helpers import (
    CLAIMS,
    SCHEDULER,
    allocated_claim,
    claim_pod,
    dra_node,
    ensure_device_class,
    namespace,
    published,
    share_claim,
)
from tests.e2e.dra_ledger import claim_entry
from tests.support.replicas import running_allocator, running_placement
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]


def _settings(work: Path, node: str, cp: ControlPlane, nats_server: NatsServer) -> DraSettings:
    return DraSettings(
        node=node,
        registry_dir=str(work / "reg"),
        plugin_dir=str(work / "plugins"),
        cdi_dir=str(work / "cdi"),
        kubeconfig=str(cp.admin_kubeconfig),
        http_host="127.0.0.1",
        http_port=0,
        socket_poll_s=0.05,
        nats_url=nats_server.url,
    )


async def test_kubelets_handshake_then_prepare_and_unprepare_claims(
    control_plane: ControlPlane, nats_server: NatsServer
) -> None:
    await asyncio.to_thread(control_plane.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    work = Path(tempfile.mkdtemp(prefix="gl-dp-", dir="/tmp"))  # unix socket paths must stay short
    try:
        # The inventory announces itself again every 2 s: the allocator, started after it, takes it in.
        node_cm = dra_node(control_plane, nats_server, inventory_interval_s=2.0, dra_binding_conditions=False)
        async with node_cm as node, namespace(node.api, node.name) as ns:
            await published(node)
            await ensure_device_class(node.api)
            settings = _settings(work, node.name, control_plane, nats_server)
            kube = {"kube": "kubeconfig", "kubeconfig": str(control_plane.admin_kubeconfig), "dra_claims": "on"}
            async with running_allocator(nats_server.url), running_placement(nats_server.url, **kube):
                await node.api.create(CLAIMS.format(ns=ns), share_claim("share"))
                await node.api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("app", node.name, "share"))
                claim = await allocated_claim(node.api, ns, "share")
                await wait_for(
                    lambda: _mirrored(nats_server, node.name, claim), 30, "the claim mirrored into the ledger", 0.1
                )
                async with running(settings) as plugin:
                    await _handshake(settings, plugin)
                    await _prepare_and_unprepare(settings, claim, node.name)
            # A claim the ledger does not hold (no claims controller ran for it) is refused.
            await node.api.create(CLAIMS.format(ns=ns), share_claim("unrecorded", "2Gi", "10"))
            await node.api.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("other", node.name, "unrecorded"))
            unrecorded = await allocated_claim(node.api, ns, "unrecorded")
            async with running(settings):
                meta = unrecorded["metadata"]
                ref = dra.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])
                channel = Channel(path=settings.dra_socket)
                try:
                    request = dra.NodePrepareResourcesRequest(claims=[ref])
                    answer = await dra.DraPluginStub(channel).node_prepare_resources(request, timeout=45)
                finally:
                    channel.close()
                refusal = answer.claims[ref.uid]
                assert "holds no entry for it" in refusal.error and not refusal.devices, refusal
                assert not list(Path(settings.cdi_dir).glob("*.json"))  # noqa: ASYNC240
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _handshake(settings: DraSettings, plugin: RunningDra) -> None:
    """What kubelet's plugin watcher does with a new socket in plugins_registry."""
    socket = Path(settings.registration_socket)
    await wait_for(lambda: asyncio.to_thread(socket.exists), 10, "the registration socket", 0.05)
    assert socket.parent == Path(settings.registry_dir) and socket.name == "gpu.gpuledger.io-reg.sock"
    channel = Channel(path=str(socket))
    try:
        stub = reg.RegistrationStub(channel)
        info = await stub.get_info(reg.InfoRequest(), timeout=5)
        assert (info.type, info.name) == ("DRAPlugin", DRIVER)
        assert info.endpoint == settings.dra_socket and Path(info.endpoint).is_absolute()
        assert info.supported_versions == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
        await stub.notify_registration_status(reg.RegistrationStatus(plugin_registered=False, error="no"), timeout=5)
        assert not plugin.registration.registered.is_set()
        await stub.notify_registration_status(reg.RegistrationStatus(plugin_registered=True), timeout=5)
        assert plugin.registration.registered.is_set()
    finally:
        channel.close()
    # kubelet's restart may remove the socket: the plugin serves a new one, a new registration.
    await asyncio.to_thread(socket.unlink)
    await wait_for(lambda: _at_least(plugin, 2), 10, "the registration socket served again", 0.05)
    await wait_for(lambda: asyncio.to_thread(socket.exists), 10, "the new registration socket", 0.05)


async def _mirrored(server: NatsServer, node: str, claim: dict[str, Any]) -> bool:
    return await claim_entry(server, node, claim["metadata"]["uid"]) is not None


async def _at_least(plugin: RunningDra, n: int) -> bool:
    return plugin.registrations >= n


async def _prepare_and_unprepare(settings: DraSettings, claim: dict[str, object], node: str) -> None:
    meta = claim["metadata"]
    assert isinstance(meta, dict)
    status = claim["status"]
    assert isinstance(status, dict)
    (result,) = status["allocation"]["devices"]["results"]
    ours = dra.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])
    stranger = dra.Claim(namespace=meta["namespace"], uid="not-this-one", name=meta["name"])
    cdi_dir = Path(settings.cdi_dir)
    channel = Channel(path=settings.dra_socket)
    try:
        v1 = dra.DraPluginStub(channel)
        answer = await v1.node_prepare_resources(dra.NodePrepareResourcesRequest(claims=[ours, stranger]), timeout=45)
        assert set(answer.claims) == {ours.uid, "not-this-one"}
        assert "uid" in answer.claims["not-this-one"].error and not answer.claims["not-this-one"].devices
        prepared = answer.claims[ours.uid]
        assert prepared.error == ""
        (device,) = prepared.devices
        assert (device.pool_name, device.device_name, device.share_id) == (node, result["device"], result["shareID"])
        assert device.request_names == ["gpu"]
        (cdi_id,) = device.cdi_device_ids
        kind, _, name = cdi_id.partition("=")
        assert kind == "k8s.gpu.gpuledger.io/claim" and name.startswith(ours.uid)
        specs = [json.loads(p.read_text()) for p in cdi_dir.glob("*.json")]  # noqa: ASYNC240 - a few small files
        (spec,) = specs
        assert spec["kind"] == kind and [d["name"] for d in spec["devices"]] == [name]
        env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
        assert env["GPULEDGER_MEMORY_LIMIT_MIB"] == "10240" and env["GPULEDGER_CORE_LIMIT_PERCENT"] == "25"
        assert env["GPULEDGER_EXCLUSIVE"] == "false"

        again = await v1.node_prepare_resources(dra.NodePrepareResourcesRequest(claims=[ours]), timeout=45)
        assert again.claims[ours.uid] == prepared  # idempotent: same names, same spec

        beta = dra_beta.DraPluginStub(channel)
        old = await beta.node_prepare_resources(
            dra_beta.NodePrepareResourcesRequest(claims=[dra_beta.Claim(ours.namespace, ours.uid, ours.name)]),
            timeout=45,
        )
        assert old.claims[ours.uid].devices[0].cdi_device_ids == [cdi_id]

        gone = await v1.node_unprepare_resources(dra.NodeUnprepareResourcesRequest(claims=[ours]), timeout=45)
        assert gone.claims[ours.uid].error == ""
        assert not list(cdi_dir.glob("*.json"))  # noqa: ASYNC240
        twice = await v1.node_unprepare_resources(dra.NodeUnprepareResourcesRequest(claims=[ours]), timeout=45)
        assert twice.claims[ours.uid].error == ""
    finally:
        channel.close()
