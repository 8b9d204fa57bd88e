"""The fake NVML's MIG model, card model by card model, against what NVIDIA's MIG User Guide
documents: the profiles and their engines ("Supported MIG Profiles"), the placements (its
``nvidia-smi mig -lgipp`` listing), the layouts its figures allow and refuse, and the GPU instance IDs
and placements its ``nvidia-smi mig -cgi`` examples print. The expected values are written out here
from the guide, not read from the fake's tables. An A30's published ``-cgi`` session stands in where
the guide shows none for the A30."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_dev.fake_nvml import FakeNvml
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import node_script
from tests.support.mig_driver import (
    clear,
    create,
    enable,
    fake_card,
    gi_info,
    placements,
    profiles,
    text,
    whole_ci,
)

pytestmark = pytest.mark.timeout(10)

_ANY7, _PAIRS = (0, 1, 2, 3, 4, 5, 6), (0, 2, 4, 6)
_SEVEN = {  # profile ID: (starts, size), the guide's -lgipp listing (A100, H100, H100 NVL)
    19: (_ANY7, 1),
    20: (_ANY7, 1),
    15: (_PAIRS, 2),
    14: ((0, 2, 4), 2),
    9: ((0, 4), 4),
    5: ((0,), 4),
    0: ((0,), 8),
}
_A30 = {14: ((0, 1, 2, 3), 1), 21: ((0, 1, 2, 3), 1), 5: ((0, 2), 2), 6: ((0, 2), 2), 0: ((0,), 4)}

# name: (ID, instances, copy engines, decoders, JPEG, OFA), from the guide's tables
_A100_40 = {
    "1g.5gb": (19, 7, 1, 0, 0, 0),
    "1g.5gb+me": (20, 1, 1, 1, 1, 1),
    "1g.10gb": (15, 4, 1, 1, 0, 0),
    "2g.10gb": (14, 3, 2, 1, 0, 0),
    "3g.20gb": (9, 2, 3, 2, 0, 0),
    "4g.20gb": (5, 1, 4, 2, 0, 0),
    "7g.40gb": (0, 1, 7, 5, 1, 1),
}
_A100_80 = dict(
    zip(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        _A100_40.values(),
        strict=True,
    )
)
_H100 = {
    "1g.10gb": (19, 7, 1, 1, 1, 0),
    "1g.10gb+me": (20, 1, 1, 1, 1, 1),
    "1g.20gb": (15, 4, 1, 1, 1, 0),
    "2g.20gb": (14, 3, 2, 2, 2, 0),
    "3g.40gb": (9, 2, 3, 3, 3, 0),
    "4g.40gb": (5, 1, 4, 4, 4, 0),
    "7g.80gb": (0, 1, 8, 7, 7, 1),
}
_H200 = dict(
    zip(
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        _H100.values(),
        strict=True,
    )
)
_A30_PROFILES = {
    "1g.6gb": (14, 4, 1, 0, 0, 0),
    "1g.6gb+me": (21, 1, 1, 1, 1, 1),
    "2g.12gb": (5, 2, 2, 2, 0, 0),
    "2g.12gb+me": (6, 1, 2, 2, 1, 1),
    "4g.24gb": (0, 1, 4, 4, 1, 1),
}
DOCUMENTED = {
    "A100-40GB": (_A100_40, _SEVEN),
    "A100-80GB": (_A100_80, _SEVEN),
    "A30": (_A30_PROFILES, _A30),
    "H100": (_H100, _SEVEN),
    "H200": (_H200, _SEVEN),
}

# Layouts the guide's figures allow, per model; each must be made whole, in this order.
VALID = {
    "A100-40GB": [
        ["1g.5gb"] * 7,
        ["7g.40gb"],
        ["4g.20gb", "3g.20gb"],
        ["3g.20gb", "3g.20gb"],
        ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"],
        ["4g.20gb", "2g.10gb", "1g.5gb"],
        ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"],
        ["1g.10gb"] * 4,
        ["1g.5gb+me"] + ["1g.5gb"] * 6,
    ],
    "A100-80GB": [
        ["1g.10gb"] * 7,
        ["4g.40gb", "3g.40gb"],
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        ["1g.20gb"] * 4,
    ],
    "A30": [
        ["1g.6gb"] * 4,
        ["4g.24gb"],
        ["2g.12gb", "2g.12gb"],
        ["2g.12gb", "1g.6gb", "1g.6gb"],
        ["2g.12gb+me", "2g.12gb"],
        ["1g.6gb+me", "1g.6gb", "1g.6gb", "1g.6gb"],
    ],
    "H100": [
        ["1g.10gb"] * 7,
        ["4g.40gb", "3g.40gb"],
        ["3g.40gb", "3g.40gb"],
        ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"],
        ["1g.20gb"] * 4,
        ["1g.10gb+me"] + ["1g.10gb"] * 6,
    ],
    "H200": [
        ["1g.18gb"] * 7,
        ["4g.71gb", "3g.71gb"],
        ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"],
        ["1g.35gb"] * 4,
    ],
}
# Layouts that do not fit: all but the last instance are made; the last is refused.
INVALID = {
    "A100-40GB": [
        ["4g.20gb", "4g.20gb"],
        ["1g.5gb"] * 8,
        ["7g.40gb", "1g.5gb"],
        ["1g.5gb+me", "1g.5gb+me"],
        ["1g.10gb"] * 5,
        ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"],  # the guide's -cgi 19,19,14,9
    ],
    "A100-80GB": [["4g.40gb", "4g.40gb"], ["1g.10gb+me", "1g.10gb+me"], ["3g.40gb"] * 3],
    "A30": [
        ["1g.6gb"] * 5,
        ["4g.24gb", "1g.6gb"],
        ["2g.12gb+me", "1g.6gb+me"],  # one JPEG and one OFA on the card: one +me instance
        ["2g.12gb"] * 3,
    ],
    "H100": [["4g.40gb", "4g.40gb"], ["1g.10gb"] * 8, ["1g.20gb"] * 5],
    "H200": [["4g.71gb", "4g.71gb"], ["1g.18gb"] * 8, ["7g.141gb", "1g.35gb"]],
}


def _enabled(model: str) -> tuple[FakeNvml, Any]:
    nv, h = fake_card(model)
    enable(nv, h)
    return nv, h


@pytest.mark.parametrize("model", sorted(DOCUMENTED))
def test_profiles_and_placements_are_as_documented(model: str) -> None:
    nv, h = _enabled(model)
    want, want_placements = DOCUMENTED[model]
    got = profiles(nv, h)
    assert sorted(got) == sorted(want)
    for name, (pid, count, ce, dec, jpeg, ofa) in want.items():
        info = got[name]
        engines = (info.copyEngineCount, info.decoderCount, info.jpegCount, info.ofaCount)
        assert (info.id, info.instanceCount, *engines) == (pid, count, ce, dec, jpeg, ofa), name
        starts, size = want_placements[pid]
        assert placements(nv, h, pid) == [(s, size) for s in starts], name


@pytest.mark.parametrize(("model", "layout"), [(m, ly) for m, lys in VALID.items() for ly in lys])
def test_documented_layouts_can_be_made(model: str, layout: list[str]) -> None:
    nv, h = _enabled(model)
    made = [create(nv, h, name) for name in layout]
    assert len({gi_info(nv, gi)[0] for gi in made}) == len(layout)
    for gi in made:
        whole_ci(nv, gi)
    assert nv.nvmlDeviceGetMaxMigDeviceCount(h) >= len(layout)
    migs = [nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(len(layout))]
    assert len({nv.nvmlDeviceGetUUID(m) for m in migs}) == len(layout)


@pytest.mark.parametrize(("model", "layout"), [(m, ly) for m, lys in INVALID.items() for ly in lys])
def test_layouts_that_do_not_fit_are_refused(model: str, layout: list[str]) -> None:
    nv, h = _enabled(model)
    for name in layout[:-1]:
        create(nv, h, name)
    last = profiles(nv, h)[layout[-1]]
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, last.id) == 0
    with pytest.raises(nv.NVMLError_InsufficientResources):
        create(nv, h, layout[-1])


@pytest.mark.parametrize(
    ("model", "order", "want"),
    [
        # the guide: -cgi 9,19,14,19 and -cgi 14,19,19,19,19,19, as (GPU instance ID, start)
        ("A100-40GB", ["3g.20gb", "1g.5gb", "2g.10gb", "1g.5gb"], [(2, 4), (7, 0), (4, 2), (8, 1)]),
        (
            "A100-40GB",
            ["2g.10gb"] + ["1g.5gb"] * 5,
            [(5, 4), (13, 6), (7, 0), (8, 1), (9, 2), (10, 3)],
        ),
        ("A100-40GB", ["3g.20gb", "3g.20gb"], [(2, 4), (1, 0)]),  # -cgi 9,3g.20gb
        ("H100", ["1g.10gb", "1g.10gb"], [(13, 6), (11, 4)]),  # an H100's -cgi 19,19,...
        ("A30", ["1g.6gb", "1g.6gb", "2g.12gb"], [(3, 0), (4, 1), (2, 2)]),  # an A30's
    ],
)
def test_where_nvml_puts_instances_and_their_ids(
    model: str, order: list[str], want: list[tuple[int, int]]
) -> None:
    nv, h = _enabled(model)
    assert [gi_info(nv, create(nv, h, name)) for name in order] == want


@pytest.mark.parametrize(
    ("model", "name", "start"), [("A100-40GB", "3g.20gb", 2), ("A30", "2g.12gb", 1)]
)
def test_a_placement_the_profile_does_not_offer_is_an_invalid_argument(
    model: str, name: str, start: int
) -> None:
    nv, h = _enabled(model)
    with pytest.raises(nv.NVMLError_InvalidArgument):
        create(nv, h, name, start)


def test_a_taken_placement_is_refused_and_a_free_one_is_used() -> None:
    nv, h = _enabled("A100-40GB")
    create(nv, h, "1g.5gb", 5)
    with pytest.raises(nv.NVMLError_InsufficientResources):
        create(nv, h, "2g.10gb", 4)
    assert gi_info(nv, create(nv, h, "2g.10gb", 2)) == (4, 2)


def test_remaining_capacity_falls_as_instances_are_made_and_destruction_frees_them() -> None:
    nv, h = _enabled("A100-40GB")
    one, three = profiles(nv, h)["1g.5gb"].id, profiles(nv, h)["3g.20gb"].id
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, one) == 7
    gi = create(nv, h, "3g.20gb")
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, one) == 4
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, three) == 1
    nv.nvmlGpuInstanceDestroy(gi)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, one) == 7
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlGpuInstanceGetInfo(gi)  # destroyed


def test_a_gpu_instance_with_compute_instances_is_in_use() -> None:
    nv, h = _enabled("A100-40GB")
    gi = create(nv, h, "3g.20gb")
    ci = whole_ci(nv, gi)
    with pytest.raises(nv.NVMLError_InUse):
        nv.nvmlGpuInstanceDestroy(gi)
    nv.nvmlComputeInstanceDestroy(ci)
    gi_id = gi_info(nv, gi)[0]
    nv.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetGpuInstanceById(h, gi_id)


def test_compute_instances_of_a_3g_as_the_guide_lists_them() -> None:
    nv, h = _enabled("A100-40GB")
    gi = create(nv, h, "3g.20gb")
    shared = nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    infos = [nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p, shared) for p in (0, 1, 2)]
    assert [(text(i.name), i.id, i.instanceCount, i.multiprocessorCount) for i in infos] == [
        ("MIG 1c.3g.20gb", 0, 3, 14),
        ("MIG 2c.3g.20gb", 1, 1, 28),
        ("MIG 3g.20gb", 2, 1, 42),
    ]
    cis = [nv.nvmlGpuInstanceCreateComputeInstance(gi, 0) for _ in range(3)]  # -cci 0,0,0
    assert [nv.nvmlComputeInstanceGetInfo(c).id for c in cis] == [0, 1, 2]
    with pytest.raises(nv.NVMLError_InsufficientResources):
        nv.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, nv.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, shared
        )


def test_mig_mode_is_pending_until_a_reset_and_refused_with_instances_or_processes() -> None:
    nv, h = fake_card("H100")
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert nv.nvmlDeviceSetMigMode(h, 1) == nv.NVML_ERROR_RESET_REQUIRED
    assert nv.nvmlDeviceGetMigMode(h) == [0, 1]
    assert nv.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    assert nv.gpu_reset(nv.nvmlDeviceGetUUID(h)).code == 0
    assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
    assert nv.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    gi = create(nv, h, "7g.80gb")
    with pytest.raises(nv.NVMLError_InUse):
        nv.nvmlDeviceSetMigMode(h, 0)
    gi_id = gi_info(nv, gi)[0]
    ci_id = nv.nvmlComputeInstanceGetInfo(whole_ci(nv, gi)).id
    nv.set_processes(0, [(4242, 100, (gi_id, ci_id))])
    with pytest.raises(nv.NVMLError_InUse):
        nv.nvmlComputeInstanceDestroy(nv.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))
    nv.set_processes(0, [])
    clear(nv, h)
    assert nv.nvmlDeviceSetMigMode(h, 0) == nv.NVML_ERROR_RESET_REQUIRED
    assert nv.nvmlDeviceGetMigMode(h) == [1, 0]
    nv.gpu_reset(nv.nvmlDeviceGetUUID(h))
    assert nv.nvmlDeviceGetMigMode(h) == [0, 0]


def test_a_reset_takes_every_instance_away() -> None:
    nv, h = _enabled("A30")
    whole_ci(nv, create(nv, h, "2g.12gb"))
    nv.gpu_reset(nv.nvmlDeviceGetUUID(h))
    assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)


def test_mig_device_uuids_and_handles_resolve_both_ways() -> None:
    nv, h = _enabled("A100-40GB")
    for name in ("3g.20gb", "2g.10gb", "1g.5gb"):
        whole_ci(nv, create(nv, h, name))
    card_uuid = nv.nvmlDeviceGetUUID(h)
    for index in range(3):
        mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, index)
        mig_uuid = nv.nvmlDeviceGetUUID(mig)
        assert mig_uuid.startswith("MIG-") and len(mig_uuid) == 40
        assert bool(nv.nvmlDeviceIsMigDeviceHandle(mig).value)
        parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert nv.nvmlDeviceGetUUID(parent) == card_uuid
        again = nv.nvmlDeviceGetHandleByUUID(mig_uuid)
        assert nv.nvmlDeviceGetGpuInstanceId(again) == nv.nvmlDeviceGetGpuInstanceId(mig)
        gi = nv.nvmlDeviceGetGpuInstanceById(h, nv.nvmlDeviceGetGpuInstanceId(mig))
        ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, nv.nvmlDeviceGetComputeInstanceId(mig))
        info = nv.nvmlComputeInstanceGetInfo(ci)
        assert gi_info(nv, info.gpuInstance)[0] == nv.nvmlDeviceGetGpuInstanceId(mig)
        assert nv.nvmlDeviceGetUUID(info.device) == card_uuid
    ids = [
        nv.nvmlDeviceGetGpuInstanceId(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i))
        for i in range(3)
    ]
    assert ids == sorted(
        ids
    )  # MIG devices come in GPU instance ID order, as nvidia-smi -L lists them
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 3)
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 7)


def test_processes_and_xids_name_their_instance() -> None:
    nv, h = _enabled("A100-40GB")
    gis = [create(nv, h, n) for n in ("4g.20gb", "3g.20gb")]
    for gi in gis:
        whole_ci(nv, gi)
    (gi4, _), (gi3, _) = (gi_info(nv, g) for g in gis)
    nv.set_processes(0, [(10, 512, (gi4, 0)), (11, 256, (gi3, 0))])
    by_index = [nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(2)]
    rows = {
        nv.nvmlDeviceGetGpuInstanceId(m): nv.nvmlDeviceGetComputeRunningProcesses(m)
        for m in by_index
    }
    assert {
        gi: [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in r] for gi, r in rows.items()
    } == {
        gi4: [(10, gi4, 0)],
        gi3: [(11, gi3, 0)],
    }
    assert sorted(p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)) == [10, 11]
    memory = nv.nvmlDeviceGetMemoryInfo(by_index[0])
    assert memory.used // (1024 * 1024) in (512, 256)
    events = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
    nv.inject_xid(0, 43, gi=gi3, ci=0)
    event = nv.nvmlEventSetWait(events, 100)
    assert (event.eventData, event.gpuInstanceId, event.computeInstanceId) == (43, gi3, 0)


def test_a_fleet_layout_is_placed_largest_first_as_an_operator_tool_makes_it() -> None:
    text = (
        "nodes:\n  - name: n1\n    profile: a100-mig-1\n    mig:\n"
        "      - {card: 0, instances: [1g.5gb, 1g.5gb, 2g.10gb, 3g.20gb]}\n"
    )
    nv = FakeNvml(node_script(parse_fleet(text, "t.yaml"), "n1"))
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
    migs = [nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(4)]
    assert [nv.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [2, 3, 9, 10]
    assert [nv.nvmlDeviceGetAttributes(m).memorySizeMB for m in migs] == [19968, 9856, 4864, 4864]


def test_an_empty_fleet_layout_is_mig_on_with_no_instances_for_instances_made_on_demand() -> None:
    text = "nodes:\n  - name: n1\n    profile: a100-pcie-4\n    mig:\n      - {card: 1, instances: []}\n"
    nv = FakeNvml(node_script(parse_fleet(text, "t.yaml"), "n1"))
    nv.nvmlInit()
    on, off = nv.nvmlDeviceGetHandleByIndex(1), nv.nvmlDeviceGetHandleByIndex(0)
    assert (nv.nvmlDeviceGetMigMode(on), nv.nvmlDeviceGetMigMode(off)) == ([1, 1], [0, 0])
    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(on, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(on, info.id) == 7  # none made yet


def test_a_card_without_a_layout_is_mig_capable_with_mig_off() -> None:
    nv, h = fake_card("A100-40GB")
    assert nv.nvmlDeviceGetMigMode(h) == [0, 0]
    assert len(placements(nv, h, 9)) == 2  # NVML lists placements with MIG off too
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceCreateGpuInstance(h, 9)
