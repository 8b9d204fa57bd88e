"""The DeviceClasses mode C allocates for (docs/dra-mode-c.md): those whose CEL selectors name
gpuledger's driver, except a class annotated ``gpuledger.io/allocation: scheduler`` (left to
kube-scheduler: mode B), which ``scheduler_too`` keeps (mode B's preemption plans claims of every
class of the driver). Listed again once ``CLASSES_TTL_S`` old."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuledger_placement.claim_fields import RESOURCE
from gpuledger_placement.claim_pods import of_driver

CLASS_CHOICE = "gpuledger.io/allocation"  # a DeviceClass annotated "scheduler" stays mode B
CLASSES = f"{RESOURCE}/deviceclasses"
CLASSES_TTL_S = 10.0


class ListApi(Protocol):
    async def list_objects(self, path: str, params: Mapping[str, str]) -> dict[str, Any]: ...


@dataclass(slots=True)
class ModeCClasses:
    api: ListApi
    driver: str
    clock: Callable[[], float] = time.time
    scheduler_too: bool = False  # the classes left to kube-scheduler as well
    at: float = float("-inf")  # when they were listed
    found: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> class

    def fresh(self) -> dict[str, Mapping[str, Any]] | None:
        """The classes as last listed, if that was less than ``CLASSES_TTL_S`` ago; else None."""
        return self.found if self.clock() - self.at < CLASSES_TTL_S else None

    async def get(self) -> dict[str, Mapping[str, Any]]:
        """The classes, listed again if they are not fresh."""
        if (found := self.fresh()) is not None:
            return found
        listed = await self.api.list_objects(CLASSES, {})
        self.found = {
            str(c["metadata"]["name"]): c
            for c in listed["items"]
            if of_driver(c, self.driver)
            and (self.scheduler_too or (c["metadata"].get("annotations") or {}).get(CLASS_CHOICE) != "scheduler")
        }
        self.at = self.clock()
        return self.found
