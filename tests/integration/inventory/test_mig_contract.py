"""The fake NVML's MIG model held to a real MIG card: the same assertions on the fake (each modelled
card) and, under ``-m gpu`` (``tox -e gpu``), on the first MIG-capable card of the machine.

The real side needs MIG mode already on (turning it on needs a reset this test will not do), no GPU
instances on that card (it creates and destroys its own, and leaves the card as it found it) and the
rights to configure MIG (root, or read access to ``/proc/driver/nvidia/capabilities/mig/config``); a
machine without such a card says so by skipping, with the reason. The default run deselects it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuledger_core.mig_profiles import MigModel, mig_model
from gpuledger_inventory.nvml import load_pynvml
from tests.support.mig_driver import (
    CARDS,
    all_gpu_instances,
    clear,
    create,
    enable,
    fake_card,
    gi_info,
    placements,
    profiles,
    whole_ci,
)

pytestmark = pytest.mark.timeout(60)

Card = tuple[Any, Any, MigModel]  # the NVML module (or fake), the card's handle, its table


def _real() -> Iterator[Card]:
    nv = load_pynvml()
    nv.nvmlInit()
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            model = mig_model(nv.nvmlDeviceGetName(h), nv.nvmlDeviceGetMemoryInfo(h).total >> 20)
            if model is None:
                continue
            if nv.nvmlDeviceGetMigMode(h)[0] != nv.NVML_DEVICE_MIG_ENABLE:
                pytest.skip(f"card {i} ({model.name}) has MIG off; turn it on (and reset) first")
            if all_gpu_instances(nv, h):
                pytest.skip(f"card {i} ({model.name}) has GPU instances; this test needs it empty")
            yield nv, h, model
            clear(nv, h)
            return
        pytest.skip("no MIG-capable card of a modelled kind on this machine")
    finally:
        nv.nvmlShutdown()


@pytest.fixture(params=[*sorted(CARDS), pytest.param("real", marks=pytest.mark.gpu)])
def card(request: pytest.FixtureRequest) -> Iterator[Card]:
    if request.param == "real":
        yield from _real()
        return
    nv, h = fake_card(request.param)
    enable(nv, h)
    name, memory = CARDS[request.param]
    model = mig_model(name, memory)
    assert model is not None
    yield nv, h, model
    nv.nvmlShutdown()


def test_the_profiles_are_the_tables(card: Card) -> None:
    nv, h, model = card
    got = profiles(nv, h)
    for p in model.profiles:
        info = got[p.name]
        counts = (info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount)
        assert counts == (p.id, p.slices, p.instances, p.multiprocessors), p.name
        engines = (info.copyEngineCount, info.decoderCount, info.jpegCount, info.ofaCount)
        assert engines == (p.copy_engines, p.decoders, p.jpegs, p.ofas), p.name
        assert abs(int(info.memorySizeMB) - p.memory_mib) <= p.memory_mib // 50, p.name
        assert placements(nv, h, p.id) == [(s, p.memory_slices) for s in p.starts], p.name


def test_a_card_of_one_slice_instances_then_a_whole_card_instance(card: Card) -> None:
    nv, h, model = card
    small = model.profiles[0]
    whole = model.whole
    made = [create(nv, h, small.name) for _ in range(small.instances)]
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, small.id) == 0
    with pytest.raises(nv.NVMLError_InsufficientResources):
        create(nv, h, whole.name)
    for gi in made:
        nv.nvmlGpuInstanceDestroy(gi)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, whole.id) == 1
    gi = create(nv, h, whole.name)
    assert gi_info(nv, gi) == (0, 0)
    nv.nvmlGpuInstanceDestroy(gi)


def test_mig_devices_resolve_both_ways(card: Card) -> None:
    nv, h, model = card
    gi = create(nv, h, model.profiles[0].name)
    ci = whole_ci(nv, gi)
    try:
        mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        mig_uuid = nv.nvmlDeviceGetUUID(mig)
        assert mig_uuid.startswith("MIG-")
        assert nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == (
            nv.nvmlDeviceGetUUID(h)
        )
        again = nv.nvmlDeviceGetHandleByUUID(mig_uuid)
        assert nv.nvmlDeviceGetGpuInstanceId(again) == gi_info(nv, gi)[0]
        assert nv.nvmlDeviceGetComputeInstanceId(again) == nv.nvmlComputeInstanceGetInfo(ci).id
        with pytest.raises(nv.NVMLError_InUse):
            nv.nvmlGpuInstanceDestroy(gi)
    finally:
        nv.nvmlComputeInstanceDestroy(ci)
        nv.nvmlGpuInstanceDestroy(gi)
