"""GetPreferredAllocation's fallback: the best-connected cards, from placement or locally.

``NatsPreferred`` asks the placement service (``gpuledger.v1.placement.preferred``) and falls
back to the local ranking (``topology.preferred``) when it does not answer within its timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Protocol

from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.model import Node
from gpuledger_plugin import topology

log = logging.getLogger(__name__)

PREFERRED_SUBJECT = f"{bus.SUBJECT_PREFIX}.placement.preferred"


class Placement(Protocol):
    async def preferred(
        self, node: Node, available: Collection[str], must_include: Collection[str], size: int
    ) -> list[str]: ...


class LocalPlacement:
    async def preferred(
        self, node: Node, available: Collection[str], must_include: Collection[str], size: int
    ) -> list[str]:
        return topology.preferred(node, available, must_include, size)


class NatsPreferred:
    def __init__(self, nc: Client, timeout_s: float, fallback: Placement | None = None) -> None:
        self.nc, self.timeout_s = nc, timeout_s
        self.fallback = fallback or LocalPlacement()

    async def preferred(
        self, node: Node, available: Collection[str], must_include: Collection[str], size: int
    ) -> list[str]:
        body = {
            "node": node.name,
            "available": sorted(available),
            "must_include": sorted(must_include),
            "size": size,
        }
        try:
            result = await bus.request(self.nc, PREFERRED_SUBJECT, body, self.timeout_s)
            ids = result.get("device_ids") if isinstance(result, dict) else None
            if isinstance(ids, list) and all(isinstance(i, str) for i in ids):
                return list(ids)
            log.warning("placement answered %s without a device_ids list", PREFERRED_SUBJECT)
        except GpuledgerError as err:
            log.debug("placement did not answer (%s); ranking cards locally", err)
        return await self.fallback.preferred(node, available, must_include, size)
