"""The fake NVML's compute instance calls: a GPU instance's compute instance profiles, their
remaining capacity, creation, listing, lookup, information and destruction. Each compute instance is
a MIG device (``nvmlDeviceGetMigDeviceHandleByIndex`` finds it).

Compute instance profiles are ``NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE``, and the ID NVML reports for
one is the same number; the engines are shared (``NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED``, the
only engine profile). Answers: InvalidArgument for an unknown profile or engine profile;
NotSupported for a profile the GPU instance does not offer; InsufficientResources when none fits;
NotFound for an unknown compute instance ID; InUse when destroying one that runs processes.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fake_nvml.mig_handles import MigHandles, out_array, set_count
from gpuledger_dev.fake_nvml.mig_state import CI_PROFILE, FakeGpuInstance, ci_free_starts, ci_starts
from gpuledger_dev.fake_nvml.model import Event

_SLICES_OF = {profile: slices for slices, profile in CI_PROFILE.items()}


def _slices(gi: FakeGpuInstance, profile: int) -> int:
    """The compute slices of a CI profile the GPU instance offers."""
    if not 0 <= profile < _nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
        raise _nvml.NVMLError_InvalidArgument()
    slices = _SLICES_OF.get(profile)
    if slices is None or slices not in ci_starts(gi):
        raise _nvml.NVMLError_NotSupported()
    return slices


def _ci_name(gi: FakeGpuInstance, slices: int) -> str:
    whole = gi.profile.name
    return f"MIG {whole}" if slices == gi.profile.slices else f"MIG {slices}c.{whole}"


class ComputeInstanceCalls(MigHandles):
    """The compute instance calls of pynvml."""

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        gi, mig = self._gpu_instance("nvmlGpuInstanceGetComputeInstanceProfileInfo", device)
        if version not in (1, 2):
            raise _nvml.NVMLError(_nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if engProfile != _nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _nvml.NVMLError_InvalidArgument()
        slices = _slices(gi, profile)
        if version == 2:
            info: Any = _nvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            info.name = _ci_name(gi, slices).encode()
        else:
            info = _nvml.c_nvmlComputeInstanceProfileInfo_t()
        p = gi.profile
        info.id, info.sliceCount = profile, slices
        info.instanceCount = len(ci_starts(gi)[slices])
        info.multiprocessorCount = mig.ci_multiprocessors(gi, slices)
        info.sharedCopyEngineCount, info.sharedDecoderCount = p.copy_engines, p.decoders
        info.sharedEncoderCount, info.sharedJpegCount = p.encoders, p.jpegs
        info.sharedOfaCount = p.ofas
        return info

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, gpuInstance: Any, profileId: int
    ) -> int:
        name = "nvmlGpuInstanceGetComputeInstanceRemainingCapacity"
        gi, _ = self._gpu_instance(name, gpuInstance)
        slices = _slices(gi, profileId)
        with self._cond:
            taken: list[int] = []
            for start in ci_free_starts(gi, slices):
                if all(start >= t + slices or t >= start + slices for t in taken):
                    taken.append(start)
        return len(taken)

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        gi, mig = self._gpu_instance("nvmlGpuInstanceCreateComputeInstance", gpuInstance)
        slices = _slices(gi, profileId)
        with self._cond:
            starts = ci_free_starts(gi, slices)
            if not starts:
                raise _nvml.NVMLError_InsufficientResources()
            made = mig.add_ci(gi, slices, starts[0])
        self._push(Event(gi.parent, _nvml.nvmlEventMigConfigChange, 0))
        return ctypes.pointer(made.ci_handle)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        gi, _ = self._gpu_instance("nvmlGpuInstanceGetComputeInstances", gpuInstance)
        slices = _slices(gi, profileId)
        with self._cond:
            found = sorted((c for c in gi.cis if c.slices == slices), key=lambda c: c.id)
        out = out_array(computeInstancesRef, len(found))
        for i, ci in enumerate(found):
            out[i] = ctypes.pointer(ci.ci_handle)
        set_count(countRef, len(found))
        return int(_nvml.NVML_SUCCESS)

    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: Any, computeInstanceId: int
    ) -> Any:
        gi, _ = self._gpu_instance("nvmlGpuInstanceGetComputeInstanceById", gpuInstance)
        found = next((c for c in gi.cis if c.id == computeInstanceId), None)
        if found is None:
            raise _nvml.NVMLError_NotFound()
        return ctypes.pointer(found.ci_handle)

    def nvmlComputeInstanceGetInfo_v2(self, computeInstance: Any) -> Any:
        ci, _ = self._compute_instance("nvmlComputeInstanceGetInfo_v2", computeInstance)
        info = _nvml.c_nvmlComputeInstanceInfo_t()
        info.device = ctypes.pointer(self._cards[ci.parent].handle)
        info.gpuInstance = ctypes.pointer(ci.gi.handle)
        info.id, info.profileId = ci.id, CI_PROFILE[ci.slices]
        info.placement.start, info.placement.size = ci.start, ci.slices
        return info

    nvmlComputeInstanceGetInfo = nvmlComputeInstanceGetInfo_v2

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        ci, _ = self._compute_instance("nvmlComputeInstanceDestroy", computeInstance)
        with self._cond:
            if self._busy(ci.parent, ci.gi.id, ci.id):
                raise _nvml.NVMLError_InUse()
            ci.gi.cis.remove(ci)
        self._push(Event(ci.parent, _nvml.nvmlEventMigConfigChange, 0))
        return int(_nvml.NVML_SUCCESS)
