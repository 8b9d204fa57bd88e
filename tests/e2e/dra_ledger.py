"""What the DRA e2e tests of the ledger share: the allocator and placement with the claims
controller (as placement's service account: the ``placement_kubeconfig`` fixture in conftest.py),
gated DRA nodes, and reads of the ledger and of claims."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

from gpuledger_common.store import LedgerStore
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, OwnerKind
from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.controlplane.cluster import ControlPlane, plain_scheduler_config
from gpuledger_dev.natsserver import NatsServer
from gpuledger_inventory.slices import DRIVER
from tests.e2e.dra_helpers import (
    CLAIMS,
    SCHEDULER,
    DraNode,
    claim_pod,
    dra_node,
    ensure_device_class,
    namespace,
    published,
)
from tests.support.replicas import RunningAllocator, RunningPlacement, running_allocator, running_placement
from tests.support.waiting import wait_for

COMMITTED, REJECTED = "gpuledger.io/committed", "gpuledger.io/rejected"


@contextlib.asynccontextmanager
async def ledger_side(server: NatsServer, kubeconfig: Path) -> AsyncIterator[tuple[RunningAllocator, RunningPlacement]]:
    """The allocator (it turns the inventory into the node's ledger) and placement with the claims
    controller, as placement's service account (``placement_kubeconfig``)."""
    async with running_allocator(server.url) as allocator, placement_with_claims(server, kubeconfig) as placement:
        yield allocator, placement


def placement_with_claims(
    server: NatsServer, kubeconfig: Path, **settings: Any
) -> contextlib.AbstractAsyncContextManager[Any]:
    return running_placement(server.url, kube="kubeconfig", kubeconfig=str(kubeconfig), dra_claims="on", **settings)


async def ledger_of(server: NatsServer, node: str) -> NodeLedger | None:
    nc = await nats.connect(server.url)
    try:
        ledger, _ = await (await LedgerStore.open(nc)).read(node)
        return ledger
    finally:
        await nc.close()


async def claim_entry(server: NatsServer, node: str, uid: str) -> Allocation | None:
    ledger = await ledger_of(server, node)
    return ledger.of_owner(f"{OwnerKind.CLAIM}:{uid}") if ledger is not None else None


def conditions(claim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The conditions of our devices' status, by type (the first device's)."""
    ours = [d for d in claim.get("status", {}).get("devices") or [] if d.get("driver") == DRIVER]
    return {c["type"]: c for c in ours[0].get("conditions", [])} if ours else {}


async def bound(api: KubeApi, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pod = await api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return pod if pod["spec"].get("nodeName") else None

    return dict(await wait_for(check, timeout, f"pod {ns}/{name} bound", 0.2))


def gated_node(
    cp: ControlPlane, server: NatsServer, profile: str, pods: int = 20, **settings: Any
) -> contextlib.AbstractAsyncContextManager[DraNode]:
    """A DRA node whose devices carry the binding condition: kube-scheduler waits for the ledger;
    ``settings``: more of its inventory's settings."""
    return dra_node(cp, server, profile, pods, dra_binding_conditions=True, **settings)


@dataclass
class World:
    """What a DRA ledger test runs against: a gated node, published and in the ledger, its namespace."""

    node: DraNode
    ns: str
    allocator: RunningAllocator

    @property
    def api(self) -> KubeApi:
        return self.node.api

    async def claimed(self, name: str, devices: dict[str, Any]) -> dict[str, Any]:
        """Claim ``name`` for ``devices`` (a claim's ``spec.devices``) and a pod of that name using it
        on the node; once the pod is bound, the claim as allocated."""
        claims = CLAIMS.format(ns=self.ns)
        await self.api.create(claims, {"metadata": {"name": name}, "spec": {"devices": devices}})
        await self.api.create(f"/api/v1/namespaces/{self.ns}/pods", claim_pod(name, self.node.name, name))
        await bound(self.api, self.ns, name)
        return dict(await self.api.get(f"{claims}/{name}"))


@contextlib.asynccontextmanager
async def gated_world(
    cp: ControlPlane,
    server: NatsServer,
    kubeconfig: Path,
    profile: str,
    placement: bool = True,
    node_settings: dict[str, Any] | None = None,
    **settings: Any,
) -> AsyncIterator[World]:
    """kube-scheduler (a profile without the extender), the allocator and, unless not
    ``placement``, placement with the claims controller (and ``settings``); a gated DRA node of
    ``profile`` (its inventory with ``node_settings``), its slices published and its ledger
    written; the DeviceClasses; a namespace of the node's name."""
    await asyncio.to_thread(cp.start_scheduler, SCHEDULER, plain_scheduler_config(SCHEDULER))
    async with contextlib.AsyncExitStack() as stack:
        allocator = await stack.enter_async_context(running_allocator(server.url))
        if placement:
            await stack.enter_async_context(placement_with_claims(server, kubeconfig, **settings))
        node = await stack.enter_async_context(gated_node(cp, server, profile, **(node_settings or {})))
        ns = await stack.enter_async_context(namespace(node.api, node.name))
        await published(node)
        await ensure_device_class(node.api)
        await wait_for(lambda: ledger_of(server, node.name), 30, f"{node.name} in the ledger", 0.2)
        yield World(node, ns, allocator)
