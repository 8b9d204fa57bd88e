"""The NVML adapter against the fake NVML, for every built-in profile."""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuledger_common.profiles import PROFILES
from gpuledger_core.model import PcieLevel
from gpuledger_dev.fake_nvml import FakeNvml, ManualClock
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import NodeScript, node_script
from gpuledger_inventory.inventory import EventKind, MigMode
from gpuledger_inventory.nvml import NvmlGpus, NvmlUnavailable, sysfs_numa_node

pytestmark = pytest.mark.timeout(10)


def sim_of(profile: str, extra: str = "") -> NodeScript:
    fleet = parse_fleet(f"nodes:\n  - name: n1\n    profile: {profile}\n{extra}", "t.yaml")
    return node_script(fleet, "n1")


def opened(sim: NodeScript, clock: ManualClock | None = None) -> tuple[FakeNvml, NvmlGpus]:
    fake = FakeNvml(sim, clock=clock)
    gpus = NvmlGpus(fake, fake.numa_node, "fake")
    gpus.open()
    return fake, gpus


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_scan_reads_cards_and_the_topology_matrix_of_every_profile(profile: str) -> None:
    sim = sim_of(profile)
    _, gpus = opened(sim)
    scan = gpus.scan()
    assert scan.links == sim.node.links
    for got, want in zip(scan.cards, sim.node.cards, strict=True):
        assert (got.card.uuid, got.card.index, got.card.minor) == (
            want.uuid,
            want.index,
            want.minor,
        )
        assert (got.card.model, got.card.memory_mib, got.card.numa) == (
            want.model,
            want.memory_mib,
            want.numa,
        )
        assert got.card.pci_bus_id.startswith("00000000:")
    assert scan.driver_version == "560.35.03"
    assert scan.cuda_version == "12.6"


def test_nvswitch_pairs_come_from_the_nvlink_p2p_status() -> None:
    fake, gpus = opened(sim_of("h100-sxm-8"))
    scan = gpus.scan()
    assert all(c.nvswitch_links == 18 for c in scan.cards)
    assert {ln.nvlinks for ln in scan.links} == {18}
    assert len(scan.links) == 28
    assert fake.calls["nvmlDeviceGetP2PStatus"] == 28
    assert "nvmlDeviceGetNvLinkRemotePciInfo" not in fake.calls  # every remote end is a switch
    assert scan.cards[0].compute_capability == (9, 0)


def test_dgx1_cube_mesh_link_counts() -> None:
    _, gpus = opened(sim_of("dgx1-v100"))
    scan = gpus.scan()
    nv = {(ln.a, ln.b): ln.nvlinks for ln in scan.links}
    assert (nv[(0, 3)], nv[(0, 4)], nv[(0, 1)], nv[(0, 5)], nv[(0, 7)]) == (2, 2, 1, 0, 0)
    for card in range(8):
        assert sum(n for (a, b), n in nv.items() if card in (a, b)) == 6
        assert sum(1 for (a, b), n in nv.items() if card in (a, b) and n) == 4
    pcie = {(ln.a, ln.b): ln.pcie for ln in scan.links}
    assert pcie[(0, 1)] is PcieLevel.NUMA_NODE
    assert pcie[(0, 4)] is PcieLevel.SYSTEM


def test_pcie_bridged_pairs() -> None:
    _, gpus = opened(sim_of("a100-pcie-4"))
    links = {(ln.a, ln.b): (ln.nvlinks, ln.pcie) for ln in gpus.scan().links}
    assert links[(0, 1)] == (4, PcieLevel.SINGLE_SWITCH)
    assert links[(2, 3)] == (4, PcieLevel.SINGLE_SWITCH)
    assert links[(0, 2)] == (0, PcieLevel.HOST_BRIDGE)


@pytest.mark.parametrize(("profile", "memory", "count"), [("rtx3090-1", 24259, 1), ("tesla-p4-2", 7611, 2)])
def test_reported_memory_is_what_nvml_says(profile: str, memory: int, count: int) -> None:
    _, gpus = opened(sim_of(profile))
    cards = gpus.scan().cards
    assert [c.card.memory_mib for c in cards] == [memory] * count
    assert all(c.mig_mode is MigMode.DISABLED and c.nvswitch_links == 0 for c in cards)


def test_mig_instances_and_their_processes() -> None:
    extra = "    processes:\n      - {card: 0, pid: 77, memory_mib: 512, mig: 1}\n"
    _, gpus = opened(sim_of("a100-mig-1", extra))
    scan = gpus.scan()
    card = scan.cards[0]
    assert card.mig_mode is MigMode.ENABLED
    assert [m.memory_mib for m in card.mig] == [19968, 9856, 4864, 4864]
    assert [m.slices for m in card.mig] == [3, 2, 1, 1]
    # the IDs NVML gives 3g.20gb, 2g.10gb and two 1g.5gb placed at 4, 0, 2 and 3 (docs/mig.md)
    assert [m.gpu_instance for m in card.mig] == [2, 3, 9, 10]
    assert all(m.uuid.startswith("MIG-") for m in card.mig)
    usage = gpus.usage(scan).cards[0]
    assert [(p.pid, p.used_mib, p.mig_uuid) for p in usage.processes] == [(77, 512, card.mig[1].uuid)]


def test_processes_with_and_without_memory() -> None:
    extra = "    processes:\n      - {card: 1, pid: 10, memory_mib: 2048}\n      - {card: 1, pid: 11}\n"
    _, gpus = opened(sim_of("tesla-p4-2", extra))
    scan = gpus.scan()
    usage = gpus.usage(scan)
    assert usage.cards[0].processes == ()
    assert [(p.pid, p.used_mib) for p in usage.cards[1].processes] == [(10, 2048), (11, None)]
    assert usage.cards[1].memory_used_mib == 2048


def test_each_process_s_share_of_the_sm_time_since_the_last_poll() -> None:
    extra = (
        "    processes:\n      - {card: 1, pid: 10, memory_mib: 2048}\n      - {card: 1, pid: 11, memory_mib: 512}\n"
    )
    fake, gpus = opened(sim_of("tesla-p4-2", extra))
    scan = gpus.scan()
    fake.set_utilization(1, {10: 35, 99: 50})  # 99 runs on no card: never reported
    usage = gpus.usage(scan).cards[1]
    assert [(p.pid, p.sm_percent) for p in usage.processes] == [(10, 35), (11, 0)]
    # nothing sampled since (NVML answers NotFound): no process used the SMs
    fake.set_utilization(1, {})
    assert [p.sm_percent for p in gpus.usage(scan).cards[1].processes] == [0, 0]


def test_no_sm_share_where_processes_are_not_sampled() -> None:
    class _NotSampled(FakeNvml):
        def nvmlDeviceGetProcessUtilization(self, handle: object, timeStamp: int) -> list[Any]:
            raise self.NVMLError_NotSupported()

    sim = sim_of("tesla-p4-2", "    processes:\n      - {card: 0, pid: 10, memory_mib: 2048}\n")
    fake = _NotSampled(sim)
    gpus = NvmlGpus(fake, fake.numa_node, "fake")
    gpus.open()
    assert [p.sm_percent for p in gpus.usage(gpus.scan()).cards[0].processes] == [None]
    extra = "    processes:\n      - {card: 0, pid: 77, memory_mib: 512, mig: 1}\n"
    _, mig = opened(sim_of("a100-mig-1", extra))  # NVML samples no process per MIG instance
    assert [p.sm_percent for p in mig.usage(mig.scan()).cards[0].processes] == [None]


class _Unsupported(FakeNvml):
    """An older driver: compute capability, PCI info and MIG mode are NotSupported."""

    def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:
        raise self.NVMLError_NotSupported()

    def nvmlDeviceGetPciInfo(self, handle: object) -> object:
        raise self.NVMLError_NotSupported()

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        raise self.NVMLError_FunctionNotFound()


def test_not_supported_degrades_to_unknown() -> None:
    fake = _Unsupported(sim_of("a100-pcie-4"))
    gpus = NvmlGpus(fake, fake.numa_node)
    gpus.open()
    scan = gpus.scan()
    assert len(scan.cards) == 4
    assert all(c.compute_capability is None and c.card.pci_bus_id == "" and c.card.numa is None for c in scan.cards)
    assert scan.cuda_version is None
    assert {ln.nvlinks for ln in scan.links} == {0}  # no bus ids to match links against


def test_the_fake_keeps_pynvml_quirks() -> None:
    fake, _ = opened(sim_of("a100-pcie-4"))
    h0, h1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.NVML_P2P_CAPS_INDEX_READ == (0,)
    with pytest.raises(ctypes.ArgumentError):
        fake.nvmlDeviceGetP2PStatus(h0, h1, fake.NVML_P2P_CAPS_INDEX_READ)
    assert fake.nvmlDeviceGetP2PStatus(h0, h1, 0) == fake.NVML_P2P_STATUS_OK
    is_mig = fake.nvmlDeviceIsMigDeviceHandle(h0)
    assert isinstance(is_mig, ctypes.c_uint)
    assert type(fake.nvmlDeviceGetPciInfo(h0)).__module__ == "pynvml"  # pynvml's own struct
    assert fake.nvmlDeviceGetHandleByIndex(0) != h0  # a fresh pointer each time, as in pynvml
    p4, _ = opened(sim_of("tesla-p4-2"))
    with pytest.raises(p4.NVMLError_NotSupported):
        p4.nvmlDeviceGetNvLinkState(p4.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(p4.NVMLError_NotSupported):
        p4.nvmlDeviceGetMigMode(p4.nvmlDeviceGetHandleByIndex(0))


class _BytesPci(FakeNvml):
    """Struct fields as bytes (pynvml 12 leaves them bytes; 13 decodes them)."""

    def nvmlDeviceGetPciInfo(self, handle: object) -> object:
        bus = super().nvmlDeviceGetPciInfo(handle).busId
        return SimpleNamespace(busId=bus.encode() if isinstance(bus, str) else bus)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: object, link: int) -> object:
        bus = super().nvmlDeviceGetNvLinkRemotePciInfo(device, link).busId
        return SimpleNamespace(busId=bus.encode() if isinstance(bus, str) else bus)


def test_bus_ids_inside_structs_may_be_bytes() -> None:
    sim = sim_of("dgx1-v100")
    fake = _BytesPci(sim)
    gpus = NvmlGpus(fake, fake.numa_node)
    gpus.open()
    scan = gpus.scan()
    assert scan.cards[0].card.pci_bus_id == "00000000:1B:00.0"
    assert scan.links == sim.node.links


def test_a_lost_card_is_reported_not_fatal() -> None:
    fake, gpus = opened(sim_of("tesla-p4-2"))
    scan = gpus.scan()
    fake.lose(1)
    usage = gpus.usage(scan)
    assert [c.lost for c in usage.cards] == [False, True]
    rescan = gpus.scan()
    assert [c.card.index for c in rescan.cards] == [0]
    assert rescan.lost == (1,)


def test_nvml_init_failure_is_unavailable() -> None:
    extra = "    faults:\n      - {kind: nvml_down}\n"
    gpus = NvmlGpus(FakeNvml(sim_of("rtx3090-1", extra)))
    with pytest.raises(NvmlUnavailable):
        gpus.open()


def test_nvml_failure_during_a_scan_is_unavailable() -> None:
    fake, gpus = opened(sim_of("rtx3090-1"))
    fake.set_nvml_down(True)
    with pytest.raises(NvmlUnavailable):
        gpus.scan()


def test_events_xid_ecc_mig_and_timeout() -> None:
    clock = ManualClock()
    extra = "    faults:\n      - {at: 5, card: 0, xid: 94, mig: 2}\n"
    fake, gpus = opened(sim_of("a100-mig-1", extra), clock)
    scan = gpus.scan()
    assert gpus.watch(scan) == {}
    assert gpus.wait(1) is None
    fake.inject_ecc(0, double=True)
    event = gpus.wait(1000)
    assert event is not None
    assert event.kind is EventKind.ECC_DOUBLE
    assert event.uuid == scan.cards[0].uuid
    clock.now = 4.0
    assert gpus.wait(1) is None
    fake.advance(1.0)
    event = gpus.wait(1000)
    assert event is not None
    assert (event.kind, event.xid) == (EventKind.XID, 94)
    assert event.mig_uuid == scan.cards[0].mig[2].uuid


def test_registration_not_supported_is_not_a_failure() -> None:
    fake, gpus = opened(sim_of("tesla-p4-2"))
    fake.set_events_supported(0, False)
    scan = gpus.scan()
    assert gpus.watch(scan) == {}
    fake.inject_xid(0, 79)  # nobody listens on card 0
    fake.inject_xid(1, 48)
    event = gpus.wait(1000)
    assert event is not None
    assert (event.uuid, event.xid) == (scan.cards[1].uuid, 48)


def test_event_wait_fails_when_nvml_fails() -> None:
    fake, gpus = opened(sim_of("tesla-p4-2"))
    gpus.watch(gpus.scan())
    fake.set_nvml_down(True)
    with pytest.raises(NvmlUnavailable):
        gpus.wait(1000)


@pytest.mark.parametrize(("content", "want"), [("1\n", 1), ("-1\n", None), ("x", None), (None, None)])
def test_sysfs_numa_node(tmp_path: Path, content: str | None, want: int | None) -> None:
    device = tmp_path / "bus/pci/devices/0000:3b:00.0"
    device.mkdir(parents=True)
    if content is not None:
        (device / "numa_node").write_text(content)
    assert sysfs_numa_node("0000:3b:00.0", tmp_path) == want
