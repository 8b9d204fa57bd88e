"""The NVML calls that read and change a card's MIG layout: its GPU instances, and making or
destroying one with its compute instance (docs/mig.md, "The node's part").

Called as pynvml is called (``tests/support/mig_driver.py`` drives the same calls), through the
module object the inventory's ``NvmlGpus`` holds (pynvml, or the fake NVML). Every function blocks;
the service runs them in worker threads, as its other NVML calls. NVML's refusals become
``MigRefused`` (``MigBusy`` while processes run), with NVML's message.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

from gpuledger_core.mig_profiles import MigModel
from gpuledger_core.model import MigSlot
from gpuledger_inventory.inventory import GpuInstance


class MigRefused(Exception):
    """NVML refused a MIG call; ``kind`` is NVML's error class name (``InsufficientResources``)."""

    def __init__(self, call: str, err: Exception) -> None:
        self.kind = type(err).__name__.removeprefix("NVMLError_")
        super().__init__(f"{call} answered {self.kind}: {err}")


class MigBusy(MigRefused):
    """NVML refused because processes (or compute instances) use the instance."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A compute instance, as its MIG device: ``uuid`` (``MIG-...``) and its instance IDs."""

    uuid: str
    gpu_instance: int
    compute_instance: int


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def gpu_instances(nv: Any, h: Any, model: MigModel | None = None) -> tuple[GpuInstance, ...]:
    """The card's GPU instances, lowest start first. A profile's name is NVML's (``MIG 1g.10gb``
    without ``MIG``), or the table's for its ID where NVML gives none. Raises NVML's errors."""
    found: list[GpuInstance] = []
    for index in range(int(nv.NVML_GPU_INSTANCE_PROFILE_COUNT)):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
        except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
            continue  # a profile this card does not offer
        name = _text(getattr(info, "name", b"") or b"").removeprefix("MIG ")
        if not name:
            known = model.by_id(int(info.id)) if model is not None else None
            name = known.name if known is not None else f"profile-{int(info.id)}"
        count = ctypes.c_uint()
        handles = (nv.c_nvmlGpuInstance_t * max(1, int(info.instanceCount)))()
        nv.nvmlDeviceGetGpuInstances(h, int(info.id), handles, ctypes.byref(count))
        for gi in handles[: count.value]:
            gi_info = nv.nvmlGpuInstanceGetInfo(gi)
            found.append(GpuInstance(int(gi_info.id), name, int(gi_info.placement.start), int(gi_info.placement.size)))
    return tuple(sorted(found, key=lambda g: (g.start, g.id)))


class MigConfig:
    """Reads and changes the MIG layout of the node's cards, one change at a time."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self._lock = threading.Lock()

    def _call(self, name: str, *args: Any) -> Any:
        nv = self.nv
        try:
            return getattr(nv, name)(*args)
        except nv.NVMLError_InUse as err:
            raise MigBusy(name, err) from err
        except nv.NVMLError as err:
            raise MigRefused(name, err) from err

    def _card(self, card: str) -> Any:
        return self._call("nvmlDeviceGetHandleByUUID", card)

    def read(self, card: str) -> tuple[GpuInstance, ...]:
        """The card's GPU instances as NVML has them now."""
        h = self._card(card)
        try:
            return gpu_instances(self.nv, h)
        except self.nv.NVMLError as err:
            raise MigRefused("reading the GPU instances", err) from err

    def create(self, card: str, profile_index: int, slot: MigSlot) -> int:
        """A GPU instance of the profile (by its NVML index) at ``slot``; its GPU instance ID."""
        nv = self.nv
        with self._lock:
            h = self._card(card)
            info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", h, profile_index)
            where = nv.c_nvmlGpuInstancePlacement_t()
            where.start, where.size = slot.start, slot.size
            gi = self._call("nvmlDeviceCreateGpuInstanceWithPlacement", h, int(info.id), ctypes.byref(where))
            return int(self._call("nvmlGpuInstanceGetInfo", gi).id)

    def compute(self, card: str, gpu_instance: int) -> MigDevice:
        """The GPU instance's first compute instance as a MIG device; one of all of it is made
        first where it has none."""
        with self._lock:
            h = self._card(card)
            gi = self._call("nvmlDeviceGetGpuInstanceById", h, gpu_instance)
            cis = self._compute_instances(gi)
            if cis:
                ci_id = min(int(self._call("nvmlComputeInstanceGetInfo", ci).id) for ci in cis)
            else:
                made = self._call("nvmlGpuInstanceCreateComputeInstance", gi, self._whole_profile(gi))
                ci_id = int(self._call("nvmlComputeInstanceGetInfo", made).id)
            return self._device(h, gpu_instance, ci_id)

    def destroy(self, card: str, gpu_instance: int) -> None:
        """Destroy the GPU instance: its compute instances first (``MigBusy`` while processes run)."""
        with self._lock:
            h = self._card(card)
            gi = self._call("nvmlDeviceGetGpuInstanceById", h, gpu_instance)
            for ci in self._compute_instances(gi):
                self._call("nvmlComputeInstanceDestroy", ci)
            self._call("nvmlGpuInstanceDestroy", gi)

    def _ci_profiles(self, gi: Any) -> list[Any]:
        nv, found = self.nv, []
        for index in range(int(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                found.append(
                    nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, index, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                )
            except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
                continue
            except nv.NVMLError as err:
                raise MigRefused("nvmlGpuInstanceGetComputeInstanceProfileInfo", err) from err
        return found

    def _whole_profile(self, gi: Any) -> int:
        """The compute instance profile that takes all of the GPU instance (what ``-C`` makes)."""
        profiles = self._ci_profiles(gi)
        if not profiles:
            raise MigRefused("nvmlGpuInstanceGetComputeInstanceProfileInfo", LookupError("no compute profile"))
        return int(max(profiles, key=lambda p: int(p.sliceCount)).id)

    def _compute_instances(self, gi: Any) -> list[Any]:
        nv, found = self.nv, []
        for info in self._ci_profiles(gi):
            count = ctypes.c_uint()
            out = (nv.c_nvmlComputeInstance_t * max(1, int(info.instanceCount)))()
            self._call("nvmlGpuInstanceGetComputeInstances", gi, int(info.id), out, ctypes.byref(count))
            found += list(out[: count.value])
        return found

    def _device(self, h: Any, gpu_instance: int, compute_instance: int) -> MigDevice:
        """The MIG device of the compute instance, found among the card's MIG device handles."""
        nv = self.nv
        for index in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", h))):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, index)
            except nv.NVMLError_NotFound:
                continue  # an empty slot
            except nv.NVMLError as err:
                raise MigRefused("nvmlDeviceGetMigDeviceHandleByIndex", err) from err
            ids = (
                int(self._call("nvmlDeviceGetGpuInstanceId", mig)),
                int(self._call("nvmlDeviceGetComputeInstanceId", mig)),
            )
            if ids == (gpu_instance, compute_instance):
                return MigDevice(_text(self._call("nvmlDeviceGetUUID", mig)), gpu_instance, compute_instance)
        raise MigRefused("nvmlDeviceGetMigDeviceHandleByIndex", LookupError(f"no MIG device of GPU instance "
                         f"{gpu_instance}, compute instance {compute_instance}"))  # fmt: skip
