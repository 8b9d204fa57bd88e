"""The fake NVML's MIG calls: a card's MIG mode, its MIG devices by index, a MIG device's parent,
GPU and compute instance IDs and attributes.

MIG queries on cards without MIG raise NotSupported; empty MIG slots raise NotFound;
``nvmlDeviceIsMigDeviceHandle`` returns a ``c_uint``, as the real binding does.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fake_nvml.model import FakeCard, FakeMig
from gpuledger_dev.fake_nvml.state import NvmlState


class MigCalls(NvmlState):
    """The MIG calls of pynvml."""

    def _mig_card(self, name: str, handle: Any) -> tuple[FakeCard, list[FakeMig]]:
        card = self._card(name, handle)
        if card.migs is None:
            raise _nvml.NVMLError_NotSupported()
        return card, card.migs

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        _, migs = self._mig_card("nvmlDeviceGetMigMode", device)
        mode = _nvml.NVML_DEVICE_MIG_ENABLE if migs else _nvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        _, migs = self._mig_card("nvmlDeviceGetMaxMigDeviceCount", device)
        return 7 if migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        _, migs = self._mig_card("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not 0 <= index < (7 if migs else 0):
            raise _nvml.NVMLError_InvalidArgument()
        if index >= len(migs):
            raise _nvml.NVMLError_NotFound()
        return ctypes.pointer(migs[index].handle)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> ctypes.c_uint:
        return ctypes.c_uint(
            int(isinstance(self._any("nvmlDeviceIsMigDeviceHandle", device), FakeMig))
        )

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        found = self._any("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        if not isinstance(found, FakeMig):
            raise _nvml.NVMLError_InvalidArgument()
        return ctypes.pointer(self._cards[found.parent].handle)

    def _mig(self, name: str, device: Any) -> FakeMig:
        found = self._any(name, device)
        if not isinstance(found, FakeMig):
            raise _nvml.NVMLError_InvalidArgument()
        return found

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", device).gi

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        self._mig("nvmlDeviceGetComputeInstanceId", device)
        return 0

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        mig = self._mig("nvmlDeviceGetAttributes", device)
        attrs = _nvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = mig.profile.multiprocessors
        attrs.gpuInstanceSliceCount = attrs.computeInstanceSliceCount = mig.profile.slices
        attrs.memorySizeMB = mig.profile.memory_mib
        return attrs
