"""The gRPC services of DRA mode: plugin registration, and DRAPlugin v1 and v1beta1 (wire only).

kubelet finds the plugin by its registration socket, asks ``GetInfo`` (type ``DRAPlugin``, the
driver's name, the DRA socket, the services served) and reports with
``NotifyRegistrationStatus``. Both DRAPlugin versions are served on the DRA socket; kubelet takes
the first of ``supported_versions`` it knows.
"""

from __future__ import annotations

import asyncio
import logging

from gpuledger_core.claims import ClaimRef
from gpuledger_plugin.dra.prepare import Outcome, Preparer
from gpuledger_proto import pluginregistration as reg
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1 as dra
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_beta

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


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
