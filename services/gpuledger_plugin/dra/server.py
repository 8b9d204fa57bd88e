"""The gRPC services of DRA mode (wire only): plugin registration, DRAPlugin v1 and v1beta1, and
DRAResourceHealth v1alpha1.

kubelet finds the plugin by its registration socket, asks ``GetInfo`` (type ``DRAPlugin``, the
driver's name, the DRA socket, the services served) and reports with
``NotifyRegistrationStatus``. Both DRAPlugin versions are served on the DRA socket; kubelet takes
the first of ``supported_versions`` it knows. On the same socket, kubelet (gate
ResourceHealthStatus, on by default since 1.36) keeps one ``NodeWatchResources`` stream open for
as long as the plugin is registered, whether or not the plugin lists the service, and opens it
again 5 s after it ends; it shows what it hears in the status of the containers that use the
devices (``allocatedResourcesStatus``). The service is listed too, as the upstream helper does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from gpuledger_core.claims import ClaimRef
from gpuledger_plugin.dra.health import DeviceHealth, Health
from gpuledger_plugin.dra.health_board import HealthBoard
from gpuledger_plugin.dra.prepare import Outcome, Preparer
from gpuledger_proto import pluginregistration as reg
from gpuledger_proto import v1alpha1 as health_pb
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1 as dra
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_beta

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")


class Registration(reg.RegistrationBase):  # type: ignore[misc]  # generated base is untyped
    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver, self.endpoint = driver, endpoint
        self.registered = asyncio.Event()
        self.status: reg.RegistrationStatus | None = None

    async def get_info(self, request: reg.InfoRequest) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint, supported_versions=list(SUPPORTED_VERSIONS)
        )

    async def notify_registration_status(self, status: reg.RegistrationStatus) -> reg.RegistrationStatusResponse:
        self.status = status
        if status.plugin_registered:
            log.info("kubelet registered DRA driver %s", self.driver)
            self.registered.set()
        else:
            log.error("kubelet refused DRA driver %s: %s", self.driver, status.error)
            self.registered.clear()
        return reg.RegistrationStatusResponse()


def _refs(claims: list[dra.Claim] | list[dra_beta.Claim]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


def _prepared_v1(outcome: Outcome) -> dra.NodePrepareResourceResponse:
    devices = [
        dra.Device(
            request_names=[d.device.request],
            pool_name=d.device.pool,
            device_name=d.device.device,
            cdi_device_ids=list(d.cdi_ids),
            share_id=d.device.share_id,
        )
        for d in outcome.devices
    ]
    return dra.NodePrepareResourceResponse(devices=devices, error=outcome.error)


def _prepared_v1beta1(outcome: Outcome) -> dra_beta.NodePrepareResourceResponse:
    devices = [
        dra_beta.Device(
            request_names=[d.device.request],
            pool_name=d.device.pool,
            device_name=d.device.device,
            cdi_device_ids=list(d.cdi_ids),
        )
        for d in outcome.devices
    ]
    return dra_beta.NodePrepareResourceResponse(devices=devices, error=outcome.error)


class DraPluginV1(dra.DraPluginBase):  # type: ignore[misc]
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def node_prepare_resources(
        self, request: dra.NodePrepareResourcesRequest
    ) -> dra.NodePrepareResourcesResponse:
        found = await self.preparer.prepare(_refs(request.claims))
        return dra.NodePrepareResourcesResponse(claims={uid: _prepared_v1(o) for uid, o in found.items()})

    async def node_unprepare_resources(
        self, request: dra.NodeUnprepareResourcesRequest
    ) -> dra.NodeUnprepareResourcesResponse:
        found = await self.preparer.unprepare(_refs(request.claims))
        answers = {uid: dra.NodeUnprepareResourceResponse(error=o.error) for uid, o in found.items()}
        return dra.NodeUnprepareResourcesResponse(claims=answers)


class DraPluginV1Beta1(dra_beta.DraPluginBase):  # type: ignore[misc]
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def node_prepare_resources(
        self, request: dra_beta.NodePrepareResourcesRequest
    ) -> dra_beta.NodePrepareResourcesResponse:
        found = await self.preparer.prepare(_refs(request.claims))
        return dra_beta.NodePrepareResourcesResponse(claims={uid: _prepared_v1beta1(o) for uid, o in found.items()})

    async def node_unprepare_resources(
        self, request: dra_beta.NodeUnprepareResourcesRequest
    ) -> dra_beta.NodeUnprepareResourcesResponse:
        found = await self.preparer.unprepare(_refs(request.claims))
        answers = {uid: dra_beta.NodeUnprepareResourceResponse(error=o.error) for uid, o in found.items()}
        return dra_beta.NodeUnprepareResourcesResponse(claims=answers)


_HEALTH = {Health.HEALTHY: health_pb.HealthStatus.HEALTHY, Health.UNHEALTHY: health_pb.HealthStatus.UNHEALTHY}


def health_response(
    pool: str, devices: tuple[DeviceHealth, ...], now: float, timeout_s: int
) -> health_pb.NodeWatchResourcesResponse:
    """Every device of ``pool``, determined at ``now`` (Unix seconds) and good for ``timeout_s``."""
    found = [
        health_pb.DeviceHealth(
            device=health_pb.DeviceIdentifier(pool_name=pool, device_name=d.device),
            health=_HEALTH[d.health],
            last_updated_time=int(now),
            health_check_timeout_seconds=timeout_s,
            message=d.message,
        )
        for d in devices
    ]
    return health_pb.NodeWatchResourcesResponse(devices=found)


class DraHealth(health_pb.DraResourceHealthBase):  # type: ignore[misc]
    """``NodeWatchResources``: the health of every device of this node's pool (its name), at once,
    on every change and every ``resend_s`` (``health_board``), each good for ``timeout_s``; the
    stream stays open until kubelet closes it or the plugin stops."""

    def __init__(self, pool: str, board: HealthBoard, resend_s: float, timeout_s: int) -> None:
        self.pool, self.board, self.resend_s, self.timeout_s = pool, board, resend_s, timeout_s

    async def node_watch_resources(
        self, request: health_pb.NodeWatchResourcesRequest
    ) -> AsyncIterator[health_pb.NodeWatchResourcesResponse]:
        log.info("kubelet opened NodeWatchResources of pool %s", self.pool)
        try:
            async with contextlib.aclosing(self.board.stream(self.resend_s)) as stream:
                async for devices in stream:
                    yield health_response(self.pool, devices, time.time(), self.timeout_s)
        finally:
            log.info("NodeWatchResources of pool %s closed", self.pool)
