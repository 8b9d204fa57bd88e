"""The cluster's unscheduled pods (``spec.nodeName=``), listed then watched, each version offered to
a callback (``gone``: deleted); listed again ``retry_s`` after any failure. Mode C's allocator and
mode B's preemption follow them (one watch serves both where mode C is on)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpuledger_core.errors import GpuledgerError

log = logging.getLogger(__name__)
PODS = "/api/v1/pods"
UNSCHEDULED = {"fieldSelector": "spec.nodeName="}


class WatchApi(Protocol):
    async def list_objects(self, path: str, params: Mapping[str, str]) -> dict[str, Any]: ...
    def watch(self, path: str, params: Mapping[str, str]) -> Any: ...


async def follow_unscheduled(
    api: WatchApi, offer: Callable[[Mapping[str, Any], bool], None], retry_s: float, who: str
) -> None:
    """Until cancelled: every unscheduled pod offered as listed, then each change as watched."""
    while True:
        try:
            listed = await api.list_objects(PODS, UNSCHEDULED)
            for pod in listed["items"]:
                offer(pod, False)
            version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
            while True:
                async for event in api.watch(PODS, {**UNSCHEDULED, "resourceVersion": version}):
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        offer(obj, event.get("type") == "DELETED")
        except GpuledgerError as err:
            log.warning("%s: following pods failed (%s); listing again in %gs", who, err, retry_s)
        await asyncio.sleep(retry_s)
