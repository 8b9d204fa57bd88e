"""The fake NVML's GPU instance calls: profile information, possible placements, remaining
capacity, creation (where NVML chooses, or at a placement), listing, lookup and destruction.

Profile calls take a profile *index* (``NVML_GPU_INSTANCE_PROFILE_*``); the others take the profile
*ID* that the profile information reports, as NVML's do. The card's table is
``gpuledger_core.mig_profiles``; what fits, and where NVML puts an instance, ``gpuledger_core.mig_layout``.
Answers: NotSupported on a card without MIG or with MIG off (possible placements excepted, which NVML
lists either way) and for a profile the card does not offer; InvalidArgument for an unknown profile
ID or a placement the profile does not offer; InsufficientResources when the placement is taken, no
placement is left, or the profile's count or the card's media engines are spent; NotFound for an
unknown GPU instance ID; InUse when destroying a GPU instance that has compute instances or
processes. Each creation and destruction queues a MIG config change event.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as _nvml

from gpuledger_core.mig_layout import choose, fits_at, remaining
from gpuledger_core.mig_profiles import GiProfile
from gpuledger_dev.fake_nvml.mig_handles import MigHandles, deref, out_array, set_count
from gpuledger_dev.fake_nvml.mig_state import CardMig, FakeGpuInstance
from gpuledger_dev.fake_nvml.model import Event


def _profile(mig: CardMig, profile_id: int) -> GiProfile:
    found = mig.model.by_id(profile_id)
    if found is None:
        raise _nvml.NVMLError_InvalidArgument()
    return found


def _profile_info(p: GiProfile, version: int) -> Any:
    if version not in (1, 2):
        raise _nvml.NVMLError(_nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    if version == 2:
        info: Any = _nvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.name = f"MIG {p.name}".encode()
    else:
        info = _nvml.c_nvmlGpuInstanceProfileInfo_t()
    info.id, info.isP2pSupported, info.sliceCount = p.id, 0, p.slices
    info.instanceCount, info.multiprocessorCount = p.instances, p.multiprocessors
    info.copyEngineCount, info.decoderCount, info.encoderCount = p.copy_engines, p.decoders, 0
    info.jpegCount, info.ofaCount, info.memorySizeMB = p.jpegs, p.ofas, p.memory_mib
    return info


class GpuInstanceCalls(MigHandles):
    """The GPU instance calls of pynvml."""

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        _, mig = self._enabled("nvmlDeviceGetGpuInstanceProfileInfo", device)
        if not 0 <= profile < _nvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _nvml.NVMLError_InvalidArgument()
        found = mig.model.by_index(profile)
        if found is None:
            raise _nvml.NVMLError_NotSupported()
        return _profile_info(found, version)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        card = self._card("nvmlDeviceGetGpuInstancePossiblePlacements", device)
        if card.mig is None:
            raise _nvml.NVMLError_NotSupported()
        p = _profile(card.mig, profileId)
        if placementsRef is not None:
            out = out_array(placementsRef, len(p.starts))
            for i, start in enumerate(p.starts):
                out[i].start, out[i].size = start, p.memory_slices
        set_count(countRef, len(p.starts))
        return int(_nvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        _, mig = self._enabled("nvmlDeviceGetGpuInstanceRemainingCapacity", device)
        with self._cond:
            return remaining(mig.model, _profile(mig, profileId), mig.placed())

    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        card, mig = self._enabled("nvmlDeviceCreateGpuInstance", device)
        p = _profile(mig, profileId)
        with self._cond:
            start = choose(mig.model, p, mig.placed())
            if start is None:
                raise _nvml.NVMLError_InsufficientResources()
            return self._made(card.index, mig.add_gi(p, start))

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any:
        card, mig = self._enabled("nvmlDeviceCreateGpuInstanceWithPlacement", device)
        p = _profile(mig, profileId)
        where = deref(placement)
        if where.start not in p.starts or where.size != p.memory_slices:
            raise _nvml.NVMLError_InvalidArgument()
        with self._cond:
            if not fits_at(mig.model, p, where.start, mig.placed()):
                raise _nvml.NVMLError_InsufficientResources()
            return self._made(card.index, mig.add_gi(p, where.start))

    def _made(self, card: int, gi: FakeGpuInstance) -> Any:
        self._push(Event(card, _nvml.nvmlEventMigConfigChange, 0))
        return ctypes.pointer(gi.handle)

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        _, mig = self._enabled("nvmlDeviceGetGpuInstances", device)
        p = _profile(mig, profileId)
        with self._cond:
            found = sorted((g for g in mig.gis if g.profile.id == p.id), key=lambda g: g.id)
        out = out_array(gpuInstancesRef, len(found))
        for i, gi in enumerate(found):
            out[i] = ctypes.pointer(gi.handle)
        set_count(countRef, len(found))
        return int(_nvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        _, mig = self._enabled("nvmlDeviceGetGpuInstanceById", device)
        with self._cond:
            gi = mig.gi_by_id(gpuInstanceId)
        if gi is None:
            raise _nvml.NVMLError_NotFound()
        return ctypes.pointer(gi.handle)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gi, _ = self._gpu_instance("nvmlGpuInstanceGetInfo", gpuInstance)
        info = _nvml.c_nvmlGpuInstanceInfo_t()
        info.device = ctypes.pointer(self._cards[gi.parent].handle)
        info.id, info.profileId = gi.id, gi.profile.id
        info.placement.start, info.placement.size = gi.start, gi.profile.memory_slices
        return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        gi, mig = self._gpu_instance("nvmlGpuInstanceDestroy", gpuInstance)
        with self._cond:
            if gi.cis or self._busy(gi.parent, gi.id):
                raise _nvml.NVMLError_InUse()
            mig.gis.remove(gi)
        self._push(Event(gi.parent, _nvml.nvmlEventMigConfigChange, 0))
        return int(_nvml.NVML_SUCCESS)
