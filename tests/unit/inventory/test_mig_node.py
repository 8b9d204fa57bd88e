"""The node's part of MIG against the fake NVML: the scan reports a card in MIG mode with its GPU
instances (static unless recorded), ``MigConfig`` makes and destroys instances through NVML's calls,
and the MIG book decides what is on demand, what is due and what is faulted."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.mig_profiles import A100_40GB
from gpuledger_core.model import Card, CardMode, MigInstance, MigSlot, Remedy
from gpuledger_dev.fake_nvml import FakeNvml
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import node_script
from gpuledger_inventory.health import HealthBook
from gpuledger_inventory.inventory import CardInfo, GpuInstance, MigMode, Scan
from gpuledger_inventory.mig_book import MigBook
from gpuledger_inventory.mig_config import MigBusy, MigConfig, MigRefused
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.state import NodeState
from gpuledger_inventory.state_file import HealthStore

pytestmark = pytest.mark.timeout(10)

A100 = "NVIDIA A100-SXM4-40GB"
FLEET = f"""
nodes:
  - name: n1
    cards:
      - {{model: {A100}, memory_mib: 40960}}
      - {{model: {A100}, memory_mib: 40960}}
      - {{model: {A100}, memory_mib: 40960}}
    mig:
      - {{card: 0, instances: [3g.20gb, 2g.10gb, 1g.5gb]}}
      - {{card: 1, instances: []}}
"""


def opened() -> tuple[FakeNvml, NvmlGpus]:
    fake = FakeNvml(node_script(parse_fleet(FLEET, "t.yaml"), "n1"))
    gpus = NvmlGpus(fake, fake.numa_node, "fake")
    gpus.open()
    return fake, gpus


def slot(profile: str, start: int) -> MigSlot:
    p = A100_40GB.by_name(profile)
    assert p is not None
    return MigSlot(profile, start, p.memory_slices)


def state_of(gpus: NvmlGpus, book: MigBook | None = None) -> NodeState:
    state = NodeState(NodeName("n1"), "fake", HealthBook(), mig=book or MigBook())
    state.apply_scan(gpus.scan(), 1.0)
    return state


def test_a_card_in_mig_mode_is_published_with_its_gpu_instances_as_static() -> None:
    _, gpus = opened()
    node = state_of(gpus).node()
    layout, empty, plain = node.cards
    assert layout.mode is CardMode.MIG and empty.mode is CardMode.MIG and plain.mode is CardMode.WHOLE
    assert plain.instances == () and empty.instances == ()
    assert {i.slot.profile for i in layout.instances} == {"3g.20gb", "2g.10gb", "1g.5gb"}
    for i in layout.instances:
        p = A100_40GB.by_name(i.slot.profile)
        assert p is not None and i.slot.start in p.starts and i.slot.size == p.memory_slices
        assert i.static and i.uuid.startswith("MIG-") and not i.fault
    assert len({i.uuid for i in layout.instances}) == 3
    assert not any(a.slot.overlaps(b.slot) for a in layout.instances for b in layout.instances if a is not b)
    assert layout.memory_mib == 40960  # the whole card's


def test_make_compute_and_destroy_through_nvmls_calls() -> None:
    fake, gpus = opened()
    config = MigConfig(fake)
    card = CardUuid(gpus.scan().cards[1].uuid)
    p = A100_40GB.by_name("1g.5gb")
    assert p is not None
    gi = config.create(card, p.index, slot("1g.5gb", 6))
    assert gi == 13  # NVML numbers the eighths 7 to 14 from the card's start
    assert config.read(card) == (GpuInstance(13, "1g.5gb", 6, 1),)
    device = config.compute(card, gi)
    assert device.uuid.startswith("MIG-") and device.gpu_instance == 13
    assert config.compute(card, gi) == device  # it has one: taken as it is
    with pytest.raises(MigRefused, match="InsufficientResources") as refused:
        config.create(card, p.index, slot("1g.5gb", 6))
    assert refused.value.kind == "InsufficientResources"
    fake.set_processes(1, [(77, 100, (13, device.compute_instance))])
    with pytest.raises(MigBusy):
        config.destroy(card, gi)
    fake.set_processes(1, [])
    config.destroy(card, gi)
    assert config.read(card) == ()


def test_a_recorded_instance_is_on_demand_and_a_record_without_its_instance_is_forgotten() -> None:
    fake, gpus = opened()
    card = CardUuid(gpus.scan().cards[1].uuid)
    book = MigBook()
    book.intend(card, slot("2g.10gb", 0), "alloc-1", 1.0)
    book.intend(card, slot("1g.5gb", 6), "alloc-2", 1.0)
    config = MigConfig(fake)
    config.create(card, 1, slot("2g.10gb", 0))  # NVML_GPU_INSTANCE_PROFILE_2_SLICE
    state = state_of(gpus, book)  # both pending: nothing forgotten while being made
    assert set(book.records) == {(card, slot("2g.10gb", 0)), (card, slot("1g.5gb", 6))}
    book.made((card, slot("2g.10gb", 0)))
    book.made((card, slot("1g.5gb", 6)))  # its making failed and nobody forgot it
    state.apply_scan(gpus.scan(), 2.0)
    assert set(book.records) == {(card, slot("2g.10gb", 0))}
    instances = state.node().cards[1].instances
    assert [(i.slot, i.static) for i in instances] == [(slot("2g.10gb", 0), False)]


def test_an_unheld_on_demand_instance_comes_due_after_keep_s_and_a_static_one_never() -> None:
    fake, gpus = opened()
    scan = gpus.scan()
    card = CardUuid(scan.cards[1].uuid)
    MigConfig(fake).create(card, 1, slot("2g.10gb", 0))
    book = MigBook(since=0.0)
    book.intend(card, slot("2g.10gb", 0), "alloc-1", 10.0)
    book.made((card, slot("2g.10gb", 0)))
    scan = gpus.scan()
    key = (card, slot("2g.10gb", 0))
    book.set_held([key], 20.0)
    assert book.due(scan, 100.0, 60.0) == []  # held
    book.set_held([], 30.0)
    assert book.due(scan, 89.0, 60.0) == []  # the ledger showed it released at 30: due at 90
    assert book.next_due(60.0) == 90.0
    book.set_held([], 40.0)  # another change of the ledger: still counted from its release
    assert [(r.key, gi.id) for r, gi in book.due(scan, 90.0, 60.0)] == [(key, 3)]  # quarters are 3 to 6
    assert all(r.card == card for r, _ in book.due(scan, 1e9, 0.0))  # card 0's instances are static


def test_a_fault_is_kept_by_its_mig_device_raised_never_lowered_and_cleared_by_the_card() -> None:
    book = MigBook()
    card = CardUuid("GPU-a")
    assert book.fault(card, "MIG-1", "XID 94", Remedy.NONE, 1.0)
    assert book.fault(card, "MIG-1", "XID 95", Remedy.DRAIN, 2.0)
    assert not book.fault(card, "MIG-1", "XID 94 again", Remedy.NONE, 3.0)
    assert (book.faults["MIG-1"].reason, book.faults["MIG-1"].since) == ("XID 95", 1.0)
    assert book.clear_faults(CardUuid("GPU-b")) == [] and book.clear_faults(card) == ["MIG-1"]


def test_a_faulted_instance_is_published_with_its_fault_and_forgotten_once_gone() -> None:
    fake, gpus = opened()
    state = state_of(gpus)
    first = state.node().cards[0].instances[0]
    state.mig.fault(CardUuid(gpus.scan().cards[0].uuid), first.uuid, "XID 95 on it", Remedy.DRAIN, 5.0)
    published = state.node().cards[0].instances
    assert published[0] == MigInstance(first.slot, True, first.uuid, "XID 95 on it", Remedy.DRAIN)
    assert all(not i.fault for i in published[1:])
    assert state.node().cards[0].healthy
    info = state.card_info(index=0)
    assert info is not None and info.mig_mode is MigMode.ENABLED
    gi = next(g.id for g in info.gpu_instances or () if g.start == first.slot.start)
    MigConfig(fake).destroy(info.uuid, gi)
    state.apply_scan(gpus.scan(), 6.0)
    assert state.mig.faults == {}


def test_the_mig_book_is_saved_only_when_it_holds_something_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    store = HealthStore(str(path))
    store.save(HealthBook(), None, MigBook())
    assert "mig" not in path.read_text()
    book = MigBook()
    book.intend(CardUuid("GPU-a"), slot("1g.5gb", 6), "alloc-1", 3.5)
    book.fault(CardUuid("GPU-a"), "MIG-1", "XID 95", Remedy.DRAIN, 4.0)
    store.save(HealthBook(), None, book)
    back = HealthStore(str(path)).load_mig()
    assert back.records == book.records and back.faults == book.faults and back.pending == set()
    path.write_text('{"mig": {"records": [{"card": "GPU-a"}]}}')
    with pytest.raises(InvalidArgument, match="cannot read the MIG instances"):
        HealthStore(str(path)).load_mig()


def test_an_unread_card_keeps_its_records() -> None:
    book = MigBook()
    card = CardUuid("GPU-a")
    book.intend(card, slot("1g.5gb", 6), "alloc-1", 1.0)
    book.made((card, slot("1g.5gb", 6)))
    unread = CardInfo(Card(card, 0, A100, 40960), mig_mode=MigMode.ENABLED, gpu_instances=None)
    assert book.seen(Scan((unread,))) == [] and len(book.records) == 1
    read = CardInfo(Card(card, 0, A100, 40960), mig_mode=MigMode.ENABLED, gpu_instances=())
    assert [r.holder for r in book.seen(Scan((read,)))] == ["alloc-1"] and book.records == {}
