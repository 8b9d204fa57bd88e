"""What the GPU and compute instance calls share: a card with MIG on, a GPU or compute instance
resolved from its handle, and the out-parameters NVML fills (a count, an array).

pynvml passes ``placementsRef``, ``gpuInstancesRef`` and ``countRef`` straight to the C library, so
callers give ctypes objects: an array (or ``byref``/``pointer`` of one) and a ``byref``/``pointer`` of a
``c_uint``. The fake reads them the same ways; an array too short raises InsufficientSize (the C
library would write past it).
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fake_nvml.mig_state import CardMig, FakeGpuInstance, FakeMig
from gpuledger_dev.fake_nvml.model import FakeCard
from gpuledger_dev.fake_nvml.state import NvmlState


def deref(ref: Any) -> Any:
    """The object a ``byref()``/``pointer()`` points at, or the object itself."""
    target = getattr(ref, "_obj", None)
    if target is not None:
        return target
    return ref.contents if isinstance(ref, ctypes._Pointer) else ref


def set_count(count_ref: Any, value: int) -> None:
    if count_ref is None:
        raise _nvml.NVMLError_InvalidArgument()
    deref(count_ref).value = value


def out_array(ref: Any, needed: int) -> Any:
    """Where ``needed`` items go: an array long enough, or a pointer (trusted, as C trusts it)."""
    target = getattr(ref, "_obj", ref)
    if isinstance(target, ctypes.Array) and len(target) < needed:
        raise _nvml.NVMLError_InsufficientSize()
    return target


class MigHandles(NvmlState):
    """Resolving the handles the MIG instance calls take."""

    def _enabled(self, name: str, device: Any) -> tuple[FakeCard, CardMig]:
        """A card in MIG mode; NotSupported for one without MIG or with MIG off."""
        card = self._card(name, device)
        if card.mig is None or not card.mig.current:
            raise _nvml.NVMLError_NotSupported()
        return card, card.mig

    def _gpu_instance(self, name: str, handle: Any) -> tuple[FakeGpuInstance, CardMig]:
        if not isinstance(handle, _nvml.c_nvmlGpuInstance_t) or not handle:
            raise ctypes.ArgumentError("argument 1: TypeError: expected a c_nvmlGpuInstance_t")
        address = ctypes.addressof(handle.contents)
        with self._cond:
            self._enter(name)
            for card in self._cards:
                mig = card.mig
                for gi in mig.gis if mig else ():
                    if ctypes.addressof(gi.handle) == address and mig is not None:
                        if card.lost:
                            raise _nvml.NVMLError_GpuIsLost()
                        return gi, mig
        raise _nvml.NVMLError_InvalidArgument()  # never made, or destroyed since

    def _compute_instance(self, name: str, handle: Any) -> tuple[FakeMig, CardMig]:
        if not isinstance(handle, _nvml.c_nvmlComputeInstance_t) or not handle:
            raise ctypes.ArgumentError("argument 1: TypeError: expected a c_nvmlComputeInstance_t")
        address = ctypes.addressof(handle.contents)
        with self._cond:
            self._enter(name)
            for card in self._cards:
                state = card.mig
                for mig in state.devices() if state else ():
                    if ctypes.addressof(mig.ci_handle) == address and state is not None:
                        if card.lost:
                            raise _nvml.NVMLError_GpuIsLost()
                        return mig, state
        raise _nvml.NVMLError_InvalidArgument()

    def _busy(self, card: int, gi: int, ci: int | None = None) -> bool:
        """Whether a process runs in the GPU instance (or in one of its compute instances)."""
        return any(
            w is not None and w[0] == gi and ci in (None, w[1])
            for _, _, w in self._cards[card].processes
        )
