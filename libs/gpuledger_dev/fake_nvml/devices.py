"""The fake NVML's library and device calls: init and shutdown, the driver's versions, a card's
handle and identity, its PCI info and memory, and the topology between cards (common ancestor,
P2P status, NVLink state and remote ends).

On NVSwitch systems every NVLink's remote device is a SWITCH and only the NVLink P2P status tells
which GPUs are joined; ``NVML_P2P_CAPS_INDEX_READ`` is the tuple ``(0,)`` and passing it fails
like the raw ctypes call does.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fake_nvml.mig_state import FakeMig
from gpuledger_dev.fake_nvml.model import FakeCard, MiB, pci
from gpuledger_dev.fake_nvml.state import NvmlState


class DeviceCalls(NvmlState):
    """The library, device and topology calls of pynvml."""

    # --- library -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._cond:
            self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
            if self._down():
                raise _nvml.NVMLError_DriverNotLoaded()
            self._refs += 1

    def nvmlShutdown(self) -> None:
        with self._cond:
            if self._refs == 0:
                raise _nvml.NVMLError_Uninitialized()
            self._refs -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._cond:
            self._enter("nvmlSystemGetDriverVersion")
        return self._driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        with self._cond:
            self._enter("nvmlSystemGetCudaDriverVersion")
        return self._cuda

    def nvmlDeviceGetCount(self) -> int:
        with self._cond:
            self._enter("nvmlDeviceGetCount")
        return len(self._cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        with self._cond:
            self._enter("nvmlDeviceGetHandleByIndex")
            if not 0 <= index < len(self._cards):
                raise _nvml.NVMLError_InvalidArgument()
            card = self._cards[index]
            if card.lost:
                raise _nvml.NVMLError_GpuIsLost()
            return ctypes.pointer(card.handle)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._card("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._card("nvmlDeviceGetMinorNumber", handle).index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._any("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._card("nvmlDeviceGetName", handle).model

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._card("nvmlDeviceGetCudaComputeCapability", handle).arch.capability

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        card = self._card("nvmlDeviceGetPciInfo", handle)
        return pci(card.bus_id, card.arch.pci_device_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        found = self._any("nvmlDeviceGetMemoryInfo", handle)
        if isinstance(found, FakeMig):
            card = self._cards[found.parent]
            total = found.profile.memory_mib
            used = sum(m or 0 for _, m, w in card.processes if w and w[0] == found.gi.id)
        else:
            total = found.memory_mib
            used = sum(m or 0 for _, m, _ in found.processes)
        memory = _nvml.c_nvmlMemory_v2_t() if version else _nvml.c_nvmlMemory_t()
        if version:
            memory.version, memory.reserved = version, 512 * MiB
        memory.total, memory.used, memory.free = total * MiB, used * MiB, (total - used) * MiB
        return memory

    # --- topology ------------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a, b = self._pair("nvmlDeviceGetTopologyCommonAncestor", device1, device2)
        if a is b:
            return int(_nvml.NVML_TOPOLOGY_INTERNAL)
        return int(self._sim.node.link(a.index, b.index).pcie)

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: Any) -> int:
        if not isinstance(p2pIndex, int):
            raise ctypes.ArgumentError(
                "argument 3: TypeError: Don't know how to convert parameter 3"
            )
        a, b = self._pair("nvmlDeviceGetP2PStatus", device1, device2)
        link = self._sim.node.link(a.index, b.index)
        if p2pIndex == _nvml.NVML_P2P_CAPS_INDEX_NVLINK:
            ok = link.nvlinks > 0
        else:
            ok = link.nvlinks > 0 or link.pcie <= _nvml.NVML_TOPOLOGY_NODE
        return int(_nvml.NVML_P2P_STATUS_OK if ok else _nvml.NVML_P2P_STATUS_NOT_SUPPORTED)

    def _port(self, name: str, handle: Any, link: int) -> tuple[FakeCard, bool]:
        card = self._card(name, handle)
        if card.arch.nvlinks == 0 and not card.links:
            raise _nvml.NVMLError_NotSupported()
        if not 0 <= link < max(card.arch.nvlinks, len(card.links)):
            raise _nvml.NVMLError_InvalidArgument()
        return card, link < len(card.links)

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        _, active = self._port("nvmlDeviceGetNvLinkState", device, link)
        return int(_nvml.NVML_FEATURE_ENABLED if active else _nvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        card, active = self._port("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if not active:
            raise _nvml.NVMLError_NotSupported()
        return card.links[link][0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        card, active = self._port("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        if not active:
            raise _nvml.NVMLError_NotSupported()
        return pci(card.links[link][1])
