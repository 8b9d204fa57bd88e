"""A card's MIG as the fake NVML holds it: the mode and its pending change, the GPU instances with
their placements, and their compute instances, each of which is a MIG device (a UUID and a device
handle of its own). The rules of what fits are ``gpuledger_core.mig_layout``'s; the calls that change
this state, and the errors they answer with, are in ``mig`` and ``mig_instances``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pynvml as _nvml

from gpuledger_core.mig_layout import Placed, gpu_instance_id
from gpuledger_core.mig_profiles import GiProfile, MigModel

# A GPU instance's compute instance profiles by its compute slices: {CI slices: CI starts}.
# The guide shows 3g.20gb's (1c x3, 2c x1, 3g x1) and an A30 2g's (1c x2, 2g x1); the others follow
# the same alignment (a CI of n slices starts at a multiple of n; the 3c of a 7g at 0 or 4).
_CI_STARTS: dict[int, dict[int, tuple[int, ...]]] = {
    1: {1: (0,)},
    2: {1: (0, 1), 2: (0,)},
    3: {1: (0, 1, 2), 2: (0,), 3: (0,)},
    4: {1: (0, 1, 2, 3), 2: (0, 2), 4: (0,)},
    7: {1: (0, 1, 2, 3, 4, 5, 6), 2: (0, 2, 4), 3: (0, 4), 4: (0,), 7: (0,)},
}
# NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE by n; the profile ID NVML reports is the same number.
CI_PROFILE = {
    1: _nvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: _nvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: _nvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: _nvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: _nvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}


@dataclass(slots=True, eq=False)
class FakeMig:
    """A MIG device: one compute instance of one GPU instance."""

    parent: int  # the card's index
    gi: FakeGpuInstance
    id: int  # compute instance ID, within its GPU instance
    slices: int  # compute slices
    start: int
    multiprocessors: int
    uuid: str
    handle: Any = field(default_factory=_nvml.struct_c_nvmlDevice_t)  # the MIG device's
    ci_handle: Any = field(default_factory=_nvml.struct_c_nvmlComputeInstance_t)

    @property
    def profile(self) -> GiProfile:
        return self.gi.profile

    @property
    def where(self) -> tuple[int, int]:
        """(GPU instance ID, compute instance ID): how NVML names it in processes and events."""
        return self.gi.id, self.id


@dataclass(slots=True, eq=False)
class FakeGpuInstance:
    parent: int
    id: int
    profile: GiProfile
    start: int
    cis: list[FakeMig] = field(default_factory=list)
    handle: Any = field(default_factory=_nvml.struct_c_nvmlGpuInstance_t)


def ci_starts(gi: FakeGpuInstance) -> dict[int, tuple[int, ...]]:
    """The compute instance profiles a GPU instance offers: {CI slices: possible starts}."""
    return _CI_STARTS.get(gi.profile.slices, {})


def ci_free_starts(gi: FakeGpuInstance, slices: int) -> list[int]:
    starts = ci_starts(gi).get(slices, ())
    return [
        s
        for s in starts
        if not any(s < c.start + c.slices and c.start < s + slices for c in gi.cis)
    ]


@dataclass(slots=True)
class CardMig:
    """One MIG-capable card's MIG: mode, pending mode, GPU instances (each with its CIs)."""

    parent: int
    card_uuid: str
    model: MigModel
    current: bool = False
    pending: bool = False
    gis: list[FakeGpuInstance] = field(default_factory=list)
    fleet: list[tuple[int, int]] = field(default_factory=list)  # the fleet file's, by index

    def placed(self) -> list[Placed]:
        return [(g.profile, g.start) for g in self.gis]

    def devices(self) -> list[FakeMig]:
        """The MIG devices in NVML's order: by GPU instance ID, then compute instance ID."""
        return sorted((c for g in self.gis for c in g.cis), key=lambda c: c.where)

    def gi_by_id(self, gi_id: int) -> FakeGpuInstance | None:
        return next((g for g in self.gis if g.id == gi_id), None)

    def add_gi(self, profile: GiProfile, start: int) -> FakeGpuInstance:
        gi = FakeGpuInstance(
            self.parent, gpu_instance_id(self.model, profile, start), profile, start
        )
        self.gis.append(gi)
        return gi

    def ci_multiprocessors(self, gi: FakeGpuInstance, slices: int) -> int:
        """A compute instance's SMs: all its GPU instance's, or those of as many 1-slice ones."""
        one_slice = self.model.by_index(_nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
        per_slice = one_slice.multiprocessors if one_slice else 0
        return gi.profile.multiprocessors if slices == gi.profile.slices else slices * per_slice

    def add_ci(self, gi: FakeGpuInstance, slices: int, start: int) -> FakeMig:
        ci_id = next(i for i in range(len(gi.cis) + 1) if all(c.id != i for c in gi.cis))
        sms = self.ci_multiprocessors(gi, slices)
        name = f"{self.card_uuid}/{gi.id}/{ci_id}"
        mig = FakeMig(
            self.parent,
            gi,
            ci_id,
            slices,
            start,
            sms,
            f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, name)}",
        )
        gi.cis.append(mig)
        return mig

    def reset(self) -> None:
        """What a reset does to MIG: the pending mode applies, and no instance survives it."""
        self.current = self.pending
        self.gis.clear()
        self.fleet.clear()
