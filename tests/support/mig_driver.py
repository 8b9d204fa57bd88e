"""Driving MIG through pynvml's calls, as a tool such as nvidia-smi or mig-parted does, over the
fake NVML or the real library alike: the tests of the fake's MIG model and its contract share it."""

from __future__ import annotations

import ctypes
from typing import Any

from gpuledger_dev.fake_nvml import FakeNvml
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import node_script

# A card per model, named as NVML names it, with the memory NVML reports (MiB).
CARDS = {
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 40960),
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", 81920),
    "A30": ("NVIDIA A30", 24576),
    "H100": ("NVIDIA H100 80GB HBM3", 81559),
    "H200": ("NVIDIA H200", 143771),
}


def fake_card(model: str) -> tuple[FakeNvml, Any]:
    """An initialised fake NVML with one card of the model, MIG off; and the card's handle."""
    name, memory = CARDS[model]
    text = f"nodes:\n  - name: n1\n    cards:\n      - {{model: {name}, memory_mib: {memory}}}\n"
    nv = FakeNvml(node_script(parse_fleet(text, "t.yaml"), "n1"))
    nv.nvmlInit()
    return nv, nv.nvmlDeviceGetHandleByIndex(0)


def enable(nv: FakeNvml, h: Any) -> None:
    """MIG on: pending after the set call, current after a reset."""
    nv.nvmlDeviceSetMigMode(h, nv.NVML_DEVICE_MIG_ENABLE)
    assert nv.gpu_reset(nv.nvmlDeviceGetUUID(h)).code == 0


def profiles(nv: Any, h: Any) -> dict[str, Any]:
    """The card's GPU instance profiles by name ("1g.5gb"), as the profile-info call reports them."""
    found: dict[str, Any] = {}
    for index in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
        except nv.NVMLError_NotSupported:
            continue
        found[text(info.name).removeprefix("MIG ")] = info
    return found


def text(value: bytes | str) -> str:
    """A name from an NVML struct: pynvml hands char arrays back as str, ctypes as bytes."""
    return value.decode() if isinstance(value, bytes) else value


def placements(nv: Any, h: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
    out = (nv.c_nvmlGpuInstancePlacement_t * count.value)()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, out, ctypes.byref(count))
    return [(p.start, p.size) for p in out[: count.value]]


def create(nv: Any, h: Any, name: str, start: int | None = None) -> Any:
    """A GPU instance of the named profile, where NVML chooses or at ``start``."""
    info = profiles(nv, h)[name]
    if start is None:
        return nv.nvmlDeviceCreateGpuInstance(h, info.id)
    where = nv.c_nvmlGpuInstancePlacement_t()
    where.start, where.size = start, placements(nv, h, info.id)[0][1]
    return nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(where))


def gi_info(nv: Any, gi: Any) -> tuple[int, int]:
    """(GPU instance ID, placement start)."""
    info = nv.nvmlGpuInstanceGetInfo(gi)
    return int(info.id), int(info.placement.start)


def whole_ci(nv: Any, gi: Any) -> Any:
    """The compute instance that takes all of a GPU instance (what ``-C`` makes)."""
    best = None
    for index in range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, index, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
            continue
        if best is None or info.sliceCount > best.sliceCount:
            best = info
    assert best is not None
    return nv.nvmlGpuInstanceCreateComputeInstance(gi, best.id)


def all_gpu_instances(nv: Any, h: Any) -> list[Any]:
    found: list[Any] = []
    for info in profiles(nv, h).values():
        count = ctypes.c_uint()
        out = (nv.c_nvmlGpuInstance_t * info.instanceCount)()
        nv.nvmlDeviceGetGpuInstances(h, info.id, out, ctypes.byref(count))
        found += list(out[: count.value])
    return found


def compute_instances(nv: Any, gi: Any) -> list[Any]:
    found: list[Any] = []
    for index in range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        count = ctypes.c_uint()
        out = (nv.c_nvmlComputeInstance_t * 8)()
        try:
            nv.nvmlGpuInstanceGetComputeInstances(gi, index, out, ctypes.byref(count))
        except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
            continue
        found += list(out[: count.value])
    return found


def clear(nv: Any, h: Any) -> None:
    """Destroy every compute and GPU instance on the card."""
    for gi in all_gpu_instances(nv, h):
        for ci in compute_instances(nv, gi):
            nv.nvmlComputeInstanceDestroy(ci)
        nv.nvmlGpuInstanceDestroy(gi)
