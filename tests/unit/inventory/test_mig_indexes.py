"""The core's MIG tables write NVML's profile indexes out as numbers (the core imports no NVML
binding): each must be the constant pynvml gives that profile."""

from __future__ import annotations

import pynvml
import pytest

from gpuledger_core.mig_profiles import MODELS, MigModel

_CONSTANTS = {
    "1g": pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    "1g+me": pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    "1g/2": pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    "2g": pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    "2g+me": pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
    "3g": pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    "4g": pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    "7g": pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
}


def _kind(name: str, memory_slices: int, compute: int) -> str:
    """The NVML profile a table row is: its compute slices, ``+me``, or a 1g of two memory slices."""
    if name.endswith("+me"):
        return f"{compute}g+me"
    return "1g/2" if compute == 1 and memory_slices == 2 else f"{compute}g"


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_each_profile_index_is_pynvmls_constant(model: MigModel) -> None:
    for profile in model.profiles:
        kind = _kind(profile.name, profile.memory_slices, profile.slices)
        assert profile.index == _CONSTANTS[kind], profile.name
