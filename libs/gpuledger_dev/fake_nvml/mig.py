"""The fake NVML's MIG calls on a card and its MIG devices: the MIG mode and its pending change,
the MIG devices by index, a MIG device's parent, GPU and compute instance IDs and attributes.

MIG queries on cards without MIG raise NotSupported; empty MIG slots raise NotFound;
``nvmlDeviceIsMigDeviceHandle`` returns a ``c_uint``, as the real binding does. A mode change is
pending until the card is reset (``gpu_reset``): ``nvmlDeviceSetMigMode`` answers
``NVML_ERROR_RESET_REQUIRED`` as its activation status, as NVML does where it cannot reset the card
itself; it is refused (InUse) while processes run on the card, and turning MIG off while GPU
instances exist is refused too.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fake_nvml.mig_state import CardMig, FakeMig
from gpuledger_dev.fake_nvml.model import FakeCard
from gpuledger_dev.fake_nvml.state import NvmlState


def _mode(enabled: bool) -> int:
    return int(_nvml.NVML_DEVICE_MIG_ENABLE if enabled else _nvml.NVML_DEVICE_MIG_DISABLE)


class MigCalls(NvmlState):
    """The MIG mode and MIG device calls of pynvml."""

    def _mig_card(self, name: str, handle: Any) -> tuple[FakeCard, CardMig]:
        card = self._card(name, handle)
        if card.mig is None:
            raise _nvml.NVMLError_NotSupported()
        return card, card.mig

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        _, mig = self._mig_card("nvmlDeviceGetMigMode", device)
        return [_mode(mig.current), _mode(mig.pending)]

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        card, mig = self._mig_card("nvmlDeviceSetMigMode", device)
        if mode not in (_nvml.NVML_DEVICE_MIG_DISABLE, _nvml.NVML_DEVICE_MIG_ENABLE):
            raise _nvml.NVMLError_InvalidArgument()
        with self._cond:
            if card.processes or (mig.gis and mode == _nvml.NVML_DEVICE_MIG_DISABLE):
                raise _nvml.NVMLError_InUse()
            mig.pending = mode == _nvml.NVML_DEVICE_MIG_ENABLE
            settled = mig.pending == mig.current
        return int(_nvml.NVML_SUCCESS if settled else _nvml.NVML_ERROR_RESET_REQUIRED)

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        _, mig = self._mig_card("nvmlDeviceGetMaxMigDeviceCount", device)
        return mig.model.max_devices if mig.current else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        _, mig = self._mig_card("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not 0 <= index < (mig.model.max_devices if mig.current else 0):
            raise _nvml.NVMLError_InvalidArgument()
        devices = mig.devices()
        if index >= len(devices):
            raise _nvml.NVMLError_NotFound()
        return ctypes.pointer(devices[index].handle)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> ctypes.c_uint:
        return ctypes.c_uint(
            int(isinstance(self._any("nvmlDeviceIsMigDeviceHandle", device), FakeMig))
        )

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        found = self._mig("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        return ctypes.pointer(self._cards[found.parent].handle)

    def _mig(self, name: str, device: Any) -> FakeMig:
        found = self._any(name, device)
        if not isinstance(found, FakeMig):
            raise _nvml.NVMLError_InvalidArgument()
        return found

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", device).gi.id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetComputeInstanceId", device).id

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        mig = self._mig("nvmlDeviceGetAttributes", device)
        gi = mig.profile
        attrs = _nvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = mig.multiprocessors
        attrs.sharedCopyEngineCount, attrs.sharedDecoderCount = gi.copy_engines, gi.decoders
        attrs.sharedEncoderCount, attrs.sharedJpegCount = gi.encoders, gi.jpegs
        attrs.sharedOfaCount = gi.ofas
        attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount = gi.slices, mig.slices
        attrs.memorySizeMB = gi.memory_mib
        return attrs
