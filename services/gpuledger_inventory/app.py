"""Wiring: the GPU backend, NATS, Kubernetes, HTTP, and the inventory loops. Nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from gpuledger_common import bus, inventory_api, lifecycle
from gpuledger_common.entry import stop_on_signals
from gpuledger_common.settings import describe
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import NodeName
from gpuledger_inventory import http
from gpuledger_inventory.attribution import Attributing
from gpuledger_inventory.cgroups import ProcCgroups
from gpuledger_inventory.health import HealthPolicy
from gpuledger_inventory.kube import KubeNodeApi, KubeSliceApi, NodeApi, SliceApi
from gpuledger_inventory.nvml import Gpus, NvmlGpus, load_pynvml
from gpuledger_inventory.publisher import SlicePublisher, sysfs_pcie_root
from gpuledger_inventory.remediation import RemediationPolicy
from gpuledger_inventory.repair import Checker, CommandResetter, NvmlChecker, Resetter, Run, run_command, simulated
from gpuledger_inventory.service import Inventory
from gpuledger_inventory.settings import InventorySettings
from gpuledger_inventory.slices import SliceConfig
from gpuledger_inventory.state import Host, NodeState
from gpuledger_inventory.state_file import HealthStore

log = logging.getLogger(__name__)
MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Running:
    inventory: Inventory
    http_url: str


def build_gpus(settings: InventorySettings) -> tuple[Gpus, Host]:
    """The real NVML, or the fake one driven by the fleet file's node."""
    if settings.fake_fleet:
        from gpuledger_dev.fake_nvml import FakeNvml
        from gpuledger_dev.fleet import FleetError, load_fleet
        from gpuledger_dev.fleet_script import node_script

        try:  # a bad fleet file, or one without this node, stops it at start, naming the line or the node
            sim = node_script(load_fleet(settings.fake_fleet), settings.node)
        except FleetError as err:
            raise InvalidArgument("fake_fleet", str(err)) from err
        except KeyError as err:
            raise InvalidArgument("fake_fleet", str(err.args[0])) from err
        fake = FakeNvml(sim)
        return NvmlGpus(fake, fake.numa_node, "fake"), Host(sim.node.cpu_milli, sim.node.memory_mib, sim.node.labels)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return NvmlGpus(load_pynvml()), Host((os.cpu_count() or 0) * 1000, pages // MiB)


def attributing(settings: InventorySettings, gpus: Gpus) -> Gpus:
    """NVML's processes with their pods, read under ``proc_root`` (empty: not attributed)."""
    if not settings.proc_root:
        log.info("proc_root is empty: GPU processes are not attributed to pods")
        return gpus
    return Attributing(gpus, ProcCgroups(Path(settings.proc_root)).of)


def build_repair(settings: InventorySettings, gpus: Gpus) -> tuple[Resetter, Checker] | None:
    """Remediation's reset and check (None: remediation is off). On the fake NVML, which has the
    reset the real library lacks (``gpu_reset``), the fake answers the reset command itself."""
    if not settings.remediate:
        return None
    run: Run = run_command
    fake: Any = getattr(gpus, "nvml", None)
    if hasattr(fake, "gpu_reset"):

        def answer(uuid: str) -> tuple[float | None, int, str]:
            done = fake.gpu_reset(uuid)
            return done.seconds, done.code, done.output

        run = simulated(answer)
    resetter = CommandResetter(settings.reset_command, settings.reset_timeout_s, run)
    return resetter, NvmlChecker(gpus, settings.check_command, settings.reset_timeout_s)


async def build_kube(
    settings: InventorySettings, stack: contextlib.AsyncExitStack, node_api: NodeApi | None, slice_api: SliceApi | None
) -> tuple[NodeApi | None, SliceApi | None]:
    """The Node's labels (wherever Kubernetes is reached) and, in DRA mode, its ResourceSlices (which
    need Kubernetes): the APIs given, else made over the ``kube`` setting's configuration; each
    closed with the stack."""
    dra = settings.mode == "dra"
    slice_api = slice_api if dra else None
    if node_api is None or (dra and slice_api is None):
        if dra:
            configuration = await settings.required_kube_configuration("mode dra (the node's ResourceSlices)")
        else:
            configuration = await settings.kube_configuration()
        if configuration is not None:
            node_api = node_api or KubeNodeApi(configuration)
            slice_api = (slice_api or KubeSliceApi(configuration)) if dra else None
    if node_api is None:
        log.info("no Kubernetes access: node labels are not maintained")
    for api in (node_api, slice_api):
        if api is not None:
            stack.push_async_callback(lifecycle.bounded(settings.stop_timeout_s, api.close, "the Kubernetes client"))
    return node_api, slice_api


def build_slices(settings: InventorySettings, state: NodeState, api: SliceApi | None) -> SlicePublisher | None:
    """DRA mode: the node's ResourceSlices (classic mode publishes none)."""
    if api is None:
        return None
    config = SliceConfig(settings.slots_per_card, settings.dra_memory_step_mib, settings.dra_binding_conditions)
    roots = (lambda _bus: None) if settings.fake_fleet else sysfs_pcie_root
    log.info("DRA mode: publishing ResourceSlices of driver %s for node %s", config.driver, settings.node)
    return SlicePublisher(state, api, config, roots, resync_s=settings.dra_resync_s)


async def serve(
    settings: InventorySettings,
    *,
    gpus: Gpus | None = None,
    host: Host | None = None,
    node_api: NodeApi | None = None,
    slice_api: SliceApi | None = None,
    stop: asyncio.Event | None = None,
    on_started: Callable[[Running], None] | None = None,
) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT when no ``stop`` is given). Each part is
    stopped, the last started first, however ``serve`` ends (a stop, a part that fails to start,
    a cancel): the inventory loops, the HTTP port, the NATS subjects, NATS drained, Kubernetes,
    NVML. A setting that does not fit (kube, in DRA mode) stops it before NATS is waited for."""
    stop = stop or stop_on_signals()
    log.info("gpuledger-inventory starting with %s", describe(settings))
    async with contextlib.AsyncExitStack() as stack:
        if gpus is None:
            gpus, default_host = build_gpus(settings)
            host = host or default_host
        gpus = attributing(settings, gpus)
        closing = functools.partial(asyncio.to_thread, gpus.close)
        stack.push_async_callback(lifecycle.bounded(settings.stop_timeout_s, closing, "NVML"))
        policy = HealthPolicy(settings.faults(), settings.recover_on_nvml_return, settings.recover_after_s)
        store = HealthStore(settings.state_file)
        state = NodeState(NodeName(settings.node), gpus.backend, store.load(policy), host or Host())
        state.remedies = store.load_remedies(RemediationPolicy(settings.retire_window_s))
        state.mig = store.load_mig()
        node_api, slice_api = await build_kube(settings, stack, node_api, slice_api)
        name = f"gpuledger-inventory-{settings.node}"
        nc = await lifecycle.nats_client(stack, settings, name, stop, settings.stop_timeout_s)
        if nc is None:
            return
        slices = build_slices(settings, state, slice_api)
        repair = build_repair(settings, gpus)
        inventory = Inventory(settings, gpus, state, nc, node_api, store, slices=slices, repair=repair)
        url = await _serve(settings, stack, nc, inventory)
        if on_started is not None:
            on_started(Running(inventory, url))
        await stop.wait()
        log.info("gpuledger-inventory stopping")
    log.info("gpuledger-inventory stopped")


async def _serve(
    settings: InventorySettings, stack: contextlib.AsyncExitStack, nc: Client, inventory: Inventory
) -> str:
    """The NATS subjects, the HTTP port and the inventory's loops, each on ``stack``; the HTTP
    port's URL. /healthz says stopped from the moment the stop begins."""
    for subject, handler in (
        (inventory_api.set_health_subject(settings.node), inventory.set_health),
        (inventory_api.get_subject(settings.node), inventory.get),
        (inventory_api.mig_make_subject(settings.node), inventory.mig.make),
    ):
        responder = await bus.Responder(nc, subject, handler).start()
        stack.push_async_callback(responder.close, settings.stop_timeout_s)
    stopping = asyncio.Event()
    routes = http.routes(inventory.ready.is_set, lambda: not stopping.is_set())
    url = http.url_of(await lifecycle.http_site(stack, routes, settings.http_host, settings.http_port))
    log.info("serving /healthz, /readyz, /metrics on %s", url)
    tasks = await lifecycle.task_group(stack)
    lifecycle.background(stack, tasks, inventory.run())
    stack.callback(stopping.set)
    return url
