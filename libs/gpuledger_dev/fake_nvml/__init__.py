"""A fake of the pynvml functions gpuledger calls, driven by a fleet node (see fleet_script.py).

``FakeNvml`` stands in for the ``pynvml`` module object: the same function names, argument
conventions and return shapes, with the quirks of the real binding (reference section C):

- errors are pynvml's own ``NVMLError_*`` classes, so ``except pynvml.NVMLError_NotSupported``
  works against either;
- handles are fresh ``c_nvmlDevice_t`` pointers on every call (compare them and you lose, as with
  the real library); structs are pynvml's own, so bytes stay bytes inside them (``pci.busId``);
- ``nvmlDeviceIsMigDeviceHandle`` returns a ``c_uint``; ``NVML_P2P_CAPS_INDEX_READ`` is the tuple
  ``(0,)`` and passing it fails like the raw ctypes call does;
- MIG queries on cards without MIG raise NotSupported; empty MIG slots raise NotFound; MIG is
  modelled as NVML has it (mode and pending mode, GPU and compute instances, placements, per card
  model from NVIDIA's MIG User Guide: ``gpuledger_core.mig_profiles``; docs/mig.md);
- on NVSwitch systems every NVLink's remote device is a SWITCH and only the NVLink P2P status tells
  which GPUs are joined;
- ``nvmlEventSetWait`` blocks until an event or the timeout, then raises ``NVMLError_Timeout``.

Scripted faults fire on the fake's clock: a real monotonic clock by default, or a ``ManualClock``
that tests move with ``advance()`` (no sleeping). Tests can also inject faults directly.

The modules, one concern each: ``model`` (what the node is made of, built from the fleet node),
``state`` (the state every call shares: clock, faults, test controls, handle resolution), and a
family of calls each over that state: ``devices`` (library, device, topology and NVLink),
``mig`` (MIG mode and MIG devices), ``mig_gpu_instances`` and ``mig_compute_instances`` (over
``mig_state`` and ``mig_handles``), ``events`` (events and processes) and ``repair`` (a card's check,
and the reset NVML has no call for). ``FakeNvml`` is all of the families.
"""

from __future__ import annotations

from typing import Any

import pynvml as _nvml

from gpuledger_dev.fake_nvml.devices import DeviceCalls
from gpuledger_dev.fake_nvml.events import EventCalls
from gpuledger_dev.fake_nvml.mig import MigCalls
from gpuledger_dev.fake_nvml.mig_compute_instances import ComputeInstanceCalls
from gpuledger_dev.fake_nvml.mig_gpu_instances import GpuInstanceCalls
from gpuledger_dev.fake_nvml.model import ALL_INSTANCES, XID_FALLEN_OFF_BUS, Arch, MiB, arch_of
from gpuledger_dev.fake_nvml.repair import RepairCalls
from gpuledger_dev.fake_nvml.state import ManualClock

__all__ = [
    "ALL_INSTANCES",
    "XID_FALLEN_OFF_BUS",
    "Arch",
    "FakeNvml",
    "ManualClock",
    "MiB",
    "arch_of",
]


class FakeNvml(DeviceCalls, MigCalls, GpuInstanceCalls, ComputeInstanceCalls, EventCalls, RepairCalls):
    """One node's NVML, as the ``pynvml`` module would present it."""

    # --- module surface that is not a function: constants, exception classes and structs -------

    def __getattr__(self, name: str) -> Any:
        value = getattr(_nvml, name)
        is_type = isinstance(value, type)  # exception classes, and the structs callers fill
        if is_type or not callable(value) or name == "nvmlExceptionClass":
            return value
        raise AttributeError(f"the fake NVML does not implement {name}")
