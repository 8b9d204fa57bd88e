"""Wiring: the GPU backend, NATS, Kubernetes, HTTP, and the inventory loops. Nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from gpuledger_common import bus, inventory_api
from gpuledger_common.entry import stop_on_signals
from gpuledger_common.fleet import load_fleet
from gpuledger_common.natscreds import credentials_of
from gpuledger_core.errors import Unavailable
from gpuledger_core.ids import NodeName
from gpuledger_inventory import http
from gpuledger_inventory.health import HealthPolicy
from gpuledger_inventory.kube import KubeNodeApi, KubeSliceApi, NodeApi, SliceApi
from gpuledger_inventory.nvml import Gpus, NvmlGpus, load_pynvml
from gpuledger_inventory.publisher import SlicePublisher, sysfs_pcie_root
from gpuledger_inventory.service import HealthStore, Inventory
from gpuledger_inventory.settings import Settings
from gpuledger_inventory.slices import SliceConfig
from gpuledger_inventory.state import Host, NodeState

log = logging.getLogger(__name__)
MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Running:
    inventory: Inventory
    http_url: str


def build_gpus(settings: Settings) -> tuple[Gpus, Host]:
    """The real NVML, or the fake one driven by the fleet file's node."""
    if settings.fake_fleet:
        from gpuledger_testing.fake_nvml import FakeNvml
        from gpuledger_testing.fleet_sim import node_sim

        sim = node_sim(load_fleet(settings.fake_fleet), settings.node)
        fake = FakeNvml(sim)
        return NvmlGpus(fake, fake.numa_node, "fake"), Host(sim.node.cpu_milli, sim.node.memory_mib, sim.node.labels)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return NvmlGpus(load_pynvml()), Host((os.cpu_count() or 0) * 1000, pages // MiB)


async def build_node_api(settings: Settings) -> NodeApi | None:
    if not settings.use_kube:
        log.info("no Kubernetes configured: node labels are not maintained")
        return None
    return await KubeNodeApi.connect(settings.in_cluster, settings.kubeconfig)


async def build_slices(settings: Settings, state: NodeState, api: SliceApi | None) -> SlicePublisher | None:
    """DRA mode: the node's ResourceSlices (classic mode publishes none)."""
    if settings.mode != "dra":
        return None
    api = api or await KubeSliceApi.connect(settings.in_cluster, settings.kubeconfig)
    config = SliceConfig(settings.slots_per_card, settings.dra_memory_step_mib, settings.dra_binding_conditions)
    roots = (lambda _bus: None) if settings.fake_fleet else sysfs_pcie_root
    log.info("DRA mode: publishing ResourceSlices of driver %s for node %s", config.driver, settings.node)
    return SlicePublisher(state, api, config, roots, resync_s=settings.dra_resync_s)


async def serve(
    settings: Settings,
    *,
    gpus: Gpus | None = None,
    host: Host | None = None,
    node_api: NodeApi | None = None,
    slice_api: SliceApi | None = None,
    stop: asyncio.Event | None = None,
    on_started: Callable[[Running], None] | None = None,
) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT when no ``stop`` is given)."""
    if gpus is None:
        gpus, default_host = build_gpus(settings)
        host = host or default_host
    policy = HealthPolicy(settings.ignore_xids, settings.recover_on_nvml_return, settings.recover_after_s)
    store = HealthStore(settings.state_file)
    state = NodeState(NodeName(settings.node), gpus.backend, store.load(policy), host or Host())
    stop = stop or stop_on_signals()
    try:
        nc = await bus.connect(
            settings.nats_url,
            f"gpuledger-inventory-{settings.node}",
            stop=stop,
            credentials=credentials_of(settings),
        )
    except Unavailable:
        if stop.is_set():  # told to stop while waiting for NATS
            log.info("stopped before NATS answered")
            return
        raise
    node_api = node_api or await build_node_api(settings)
    slices = await build_slices(settings, state, slice_api)
    inventory = Inventory(settings, gpus, state, nc, node_api, store, slices=slices)
    responders = [
        await bus.Responder(nc, inventory_api.set_health_subject(settings.node), inventory.set_health).start(),
        await bus.Responder(nc, inventory_api.get_subject(settings.node), inventory.get).start(),
    ]
    alive = True
    runner, url = await http.start(
        http.routes(inventory.ready.is_set, lambda: alive), settings.http_host, settings.http_port
    )
    log.info("serving /healthz, /readyz, /metrics on %s", url)
    try:
        if on_started is not None:
            on_started(Running(inventory, url))
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(inventory.run())
            await stop.wait()
            log.info("stopping")
            task.cancel()
    finally:
        alive = False
        await _shutdown(settings, inventory, responders, runner, nc, node_api)
        if slices is not None:
            with contextlib.suppress(Exception):
                await slices.api.close()


async def _shutdown(
    settings: Settings,
    inventory: Inventory,
    responders: list[bus.Responder],
    runner: object,
    nc: object,
    node_api: NodeApi | None,
) -> None:
    timeout = settings.stop_timeout_s
    for responder in responders:
        await responder.close(timeout)
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            await inventory.close()
    with contextlib.suppress(Exception):
        await runner.cleanup()  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            await nc.drain()  # type: ignore[attr-defined]
    if node_api is not None:
        with contextlib.suppress(Exception):
            await node_api.close()
