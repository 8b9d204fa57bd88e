"""The DevicePlugin gRPC service kubelet calls: wire messages in and out, every call bounded.

kubelet waits on Allocate and GetPreferredAllocation without a deadline, and a stuck call blocks
every pod on the node; each call here answers within ``timeout_s`` with a message a person can
act on, whatever NATS or the ledger are doing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from grpclib import GRPCError
from grpclib.const import Status

from gpuledger_core.errors import (
    Conflict,
    Exhausted,
    FailedPrecondition,
    GpuledgerError,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from gpuledger_plugin.answer import Answer
from gpuledger_plugin.board import DeviceBoard
from gpuledger_plugin.devices import Advertised
from gpuledger_plugin.metrics import ALLOCATE_SECONDS, ANSWERS, PREFERRED_SECONDS
from gpuledger_plugin.mig_resources import GPU_RESOURCE
from gpuledger_plugin.service import PluginService
from gpuledger_proto import v1beta1 as dp

log = logging.getLogger(__name__)
T = TypeVar("T")

OPTIONS = dp.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

_STATUS: dict[type[GpuledgerError], Status] = {
    InvalidArgument: Status.INVALID_ARGUMENT,
    NotFound: Status.NOT_FOUND,
    Exhausted: Status.RESOURCE_EXHAUSTED,
    Conflict: Status.ABORTED,
    Unavailable: Status.UNAVAILABLE,
    FailedPrecondition: Status.FAILED_PRECONDITION,
}


class DevicePlugin(dp.DevicePluginBase):  # type: ignore[misc]  # generated base is untyped
    """One resource's service (``gpuledger.io/gpu``, or a MIG resource: ``mig_resources``); every
    resource's calls go to the one ``PluginService``, matching only that resource's containers."""

    def __init__(
        self, service: PluginService, timeout_s: float, nats_url: str = "", resource: str = GPU_RESOURCE
    ) -> None:
        self.service, self.timeout_s, self.nats_url, self.resource = service, timeout_s, nats_url, resource

    @property
    def board(self) -> DeviceBoard:
        if self.resource == GPU_RESOURCE:
            return self.service.board
        return self.service.mig_boards.boards[self.resource]

    async def get_device_plugin_options(self, empty: dp.Empty) -> dp.DevicePluginOptions:
        return OPTIONS

    async def list_and_watch(self, empty: dp.Empty) -> AsyncIterator[dp.ListAndWatchResponse]:
        log.info("kubelet opened ListAndWatch of %s", self.resource)
        async for devices in self.board.stream():
            yield dp.ListAndWatchResponse(devices=[device_of(d) for d in devices])

    async def get_preferred_allocation(self, request: dp.PreferredAllocationRequest) -> dp.PreferredAllocationResponse:
        started = time.perf_counter()
        answers = []
        for ask in request.container_requests:
            accepts = self.service.accepts(self.resource)
            available, must = ask.available_device_i_ds, ask.must_include_device_i_ds
            work = self.service.preferred(available, must, ask.allocation_size, accepts)
            ids = await self._bounded("GetPreferredAllocation", work)
            answers.append(dp.ContainerPreferredAllocationResponse(device_i_ds=ids))
        PREFERRED_SECONDS.observe(time.perf_counter() - started)
        return dp.PreferredAllocationResponse(container_responses=answers)

    async def allocate(self, request: dp.AllocateRequest) -> dp.AllocateResponse:
        started = time.perf_counter()
        if not request.container_requests:
            raise GRPCError(Status.INVALID_ARGUMENT, "Allocate needs one container request")
        answers = []
        for ask in request.container_requests:
            work = self.service.allocate(ask.devices_ids, self.service.accepts(self.resource))
            outcome = await self._bounded("Allocate", work)
            answers.append(response_of(outcome.answer))
        ALLOCATE_SECONDS.observe(time.perf_counter() - started)
        return dp.AllocateResponse(container_responses=answers)

    async def pre_start_container(self, request: dp.PreStartContainerRequest) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()

    async def _bounded(self, call: str, work: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await work
        except TimeoutError:
            ANSWERS.labels(call, "timeout").inc()
            message = self._prefix(
                f"{call} could not finish within {self.timeout_s:g}s: the ledger (NATS at "
                f"{self.nats_url or 'the configured URL'}) is not answering. kubelet will not "
                "start this container; check NATS and the allocator, then recreate the pod"
            )
            log.warning("%s", message)
            raise GRPCError(Status.DEADLINE_EXCEEDED, message) from None
        except GpuledgerError as err:
            ANSWERS.labels(call, err.code).inc()
            message = self._prefix(f"{call} refused: {err}")
            log.warning("%s", message)
            raise GRPCError(_status(err), message) from err
        ANSWERS.labels(call, "ok").inc()
        return result

    def _prefix(self, text: str) -> str:
        return f"gpuledger-plugin on node {self.service.node}: {text}"


def _status(err: GpuledgerError) -> Status:
    return next((s for kind, s in _STATUS.items() if isinstance(err, kind)), Status.INTERNAL)


def device_of(device: Advertised) -> dp.Device:
    topology = dp.TopologyInfo(nodes=[dp.NumaNode(id=device.numa)]) if device.numa is not None else None
    return dp.Device(id=device.id, health=device.health, topology=topology)


def response_of(answer: Answer) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs=dict(answer.envs),
        mounts=[dp.Mount(m.container_path, m.host_path, m.read_only) for m in answer.mounts],
        devices=[dp.DeviceSpec(d.container_path, d.host_path, d.permissions) for d in answer.devices],
        annotations=dict(answer.annotations),
        cdi_devices=[dp.CdiDevice(name=n) for n in answer.cdi_devices],
    )
