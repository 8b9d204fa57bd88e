"""The MIG keeper over the fake NVML, with a host that records what it is asked: ``mig.make``'s
answers and errors, the intent saved before NVML is asked, destruction of unheld on-demand
instances (never static ones, retried while processes run) and an XID kept to its instance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core.errors import Exhausted, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, CardShare, Grant, MigSlot, Node, Owner, OwnerKind, Remedy
from gpuledger_dev.fake_nvml import FakeNvml
from gpuledger_inventory.faults import Action, FaultPolicy
from gpuledger_inventory.health import HealthBook, HealthPolicy
from gpuledger_inventory.inventory import EventKind, GpuEvent
from gpuledger_inventory.mig_book import MigRecord
from gpuledger_inventory.mig_config import MigConfig
from gpuledger_inventory.mig_keeper import MigKeeper
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.state import NodeState
from tests.unit.inventory.test_mig_node import opened, slot

pytestmark = pytest.mark.timeout(10)


@dataclass
class Host:
    gpus: NvmlGpus
    state: NodeState
    saved: list[list[MigRecord]] = field(default_factory=list)  # the records at each save
    published: int = 0
    open: bool = True

    def nvml_open(self) -> bool:
        return self.open

    async def rescan(self) -> None:
        self.state.apply_scan(self.gpus.scan(), 0.0)
        await self.save()
        self.published += 1

    async def save(self) -> None:
        self.saved.append(list(self.state.mig.records.values()))

    async def publish(self) -> None:
        self.published += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def keeper(policy: FaultPolicy | None = None) -> tuple[FakeNvml, Host, MigKeeper, Clock]:
    fake, gpus = opened()
    state = NodeState(NodeName("n1"), "fake", HealthBook(HealthPolicy(policy or FaultPolicy())))
    state.apply_scan(gpus.scan(), 0.0)
    host, clock = Host(gpus, state), Clock()
    return fake, host, MigKeeper(host, MigConfig(fake), 60.0, clock), clock


def ask(card: str, profile: str, start: int, size: int | None = None, holder: str = "alloc-1") -> dict[str, Any]:
    s = slot(profile, start)
    return {"schema": 1, "card": card, "profile": profile, "start": start, "size": size or s.size, "holder": holder}


def uuid(host: Host, index: int) -> str:
    info = host.state.card_info(index=index)
    assert info is not None
    return info.uuid


def holding(host: Host, *slots: tuple[int, MigSlot]) -> NodeLedger:
    shares = tuple(CardShare(CardUuid(uuid(host, i)), i, 5120, 142, False, s) for i, s in slots)
    grant = Grant("main", shares)
    owner = Owner(OwnerKind.POD, "pod-1")
    return NodeLedger(Node(NodeName("n1"), ()), (Allocation(AllocationId("alloc-1"), owner, NodeName("n1"), (grant,)),))


async def test_make_records_the_intent_first_then_makes_scans_and_answers() -> None:
    _, host, mig, _ = keeper()
    card = uuid(host, 1)
    made = MadeMig.from_json(await mig.make(ask(card, "1g.5gb", 6)))
    assert made.uuid.startswith("MIG-") and (made.gpu_instance, made.card_index) == (13, 1)
    assert [r.slot for r in host.saved[0]] == [slot("1g.5gb", 6)]  # on disk before NVML was asked
    instances = host.state.node().cards[1].instances
    assert [(i.slot, i.static, i.uuid) for i in instances] == [(slot("1g.5gb", 6), False, made.uuid)]
    assert host.published == 1
    again = MadeMig.from_json(await mig.make(ask(card, "1g.5gb", 6, holder="alloc-2")))
    assert again == made and host.state.mig.records[(CardUuid(card), slot("1g.5gb", 6))].holder == "alloc-1"


async def test_an_existing_static_instance_is_answered_as_it_is() -> None:
    _, host, mig, _ = keeper()
    static = host.state.node().cards[0].instances[0]
    made = MadeMig.from_json(await mig.make(ask(uuid(host, 0), static.slot.profile, static.slot.start)))
    assert made.uuid == static.uuid and host.state.mig.records == {}


@pytest.mark.parametrize(
    ("index", "profile", "start", "size", "error", "message"),
    [
        (9, "1g.5gb", 6, 1, NotFound, r"no card GPU-nope on node n1 \(for MIG 1g.5gb at 6\)"),
        (2, "1g.5gb", 6, 1, FailedPrecondition, r"card 2 .* MIG 1g.5gb at 6: the card is not in MIG mode"),
        (
            1,
            "1g.20gb",
            0,
            2,
            InvalidArgument,
            r"MIG 1g.20gb at 0: NVIDIA A100-SXM4-40GB offers no 1g.20gb \(it offers 1g.5gb, ",
        ),
        (1, "2g.10gb", 1, 2, InvalidArgument, r"2g.10gb has no placement at 1 of size 2 \(starts 0, 2, 4"),
        (1, "2g.10gb", 0, 3, InvalidArgument, r"2g.10gb has no placement at 0 of size 3"),
    ],
)
async def test_a_make_that_cannot_be_says_which_card_and_profile(
    index: int, profile: str, start: int, size: int, error: type[Exception], message: str
) -> None:
    _, host, mig, _ = keeper()
    card = uuid(host, index) if index < 3 else "GPU-nope"
    body = {"card": card, "profile": profile, "start": start, "size": size, "holder": "a"}
    with pytest.raises(error, match=message):
        await mig.make(body)
    assert host.state.mig.records == {} and host.saved == []


async def test_an_overlap_waits_until_let_go_and_nvmls_refusal_names_card_and_profile_and_leaves_no_record() -> None:
    _, host, mig, _ = keeper()
    card = uuid(host, 1)
    await mig.make(ask(card, "4g.20gb", 0))
    mig.reclaim_wait_s = 0.3
    with pytest.raises(Unavailable, match=r"card 1 .* MIG 2g.10gb at 2: the node's ledger is not read yet"):
        await mig.make(ask(card, "2g.10gb", 2))
    mig.set_ledger(holding(host, (1, slot("4g.20gb", 0))))
    with pytest.raises(Unavailable, match=r"MIG 2g.10gb at 2: the instance 4g.20gb at 0 in its way is still held"):
        await mig.make(ask(card, "2g.10gb", 2))
    mig.set_ledger(None)  # let go: made on demand, so it gives way
    await mig.make(ask(card, "2g.10gb", 2))
    assert {r.slot.profile for r in host.state.mig.records.values()} == {"2g.10gb"}
    await mig.make(ask(card, "3g.20gb", 4))
    await mig.make(ask(card, "1g.5gb+me", 0))
    with pytest.raises(Exhausted, match=r"card 1 .* MIG 1g.5gb\+me at 1: NVML refused to make it: .*InsufficientRes"):
        await mig.make(ask(card, "1g.5gb+me", 1))  # one media engine per card
    assert {r.slot.profile for r in host.state.mig.records.values()} == {"2g.10gb", "3g.20gb", "1g.5gb+me"}
    with pytest.raises(InvalidArgument, match="holder"):
        await mig.make({"card": card, "profile": "1g.5gb", "start": 6, "size": 1})
    host.open = False
    with pytest.raises(Unavailable, match="NVML is not open"):
        await mig.make(ask(card, "1g.5gb", 6))


async def test_unheld_on_demand_instances_are_destroyed_after_keep_s_retried_while_in_use() -> None:
    fake, host, mig, clock = keeper()
    card = uuid(host, 1)
    made = MadeMig.from_json(await mig.make(ask(card, "1g.5gb", 6)))
    static_before = host.state.node().cards[0].instances
    await mig.sweep()
    assert len(host.state.node().cards[1].instances) == 1  # the ledger was never read: nothing is due
    mig.set_ledger(holding(host, (1, slot("1g.5gb", 6))))
    clock.now += 1000
    await mig.sweep()
    assert len(host.state.node().cards[1].instances) == 1  # held
    mig.set_ledger(None)  # released (the node's key is gone)
    clock.now += 59
    await mig.sweep()
    assert len(host.state.node().cards[1].instances) == 1  # kept for reuse
    fake.set_processes(1, [(77, 100, (made.gpu_instance, made.compute_instance))])
    clock.now += 1
    await mig.sweep()
    assert len(host.state.node().cards[1].instances) == 1  # in use: tried again later
    fake.set_processes(1, [])
    await mig.sweep()
    assert host.state.node().cards[1].instances == () and host.state.mig.records == {}
    assert host.state.node().cards[0].instances == static_before  # static: never destroyed


async def test_an_xid_in_one_instance_faults_that_instance_not_the_card() -> None:
    _, host, mig, _ = keeper(FaultPolicy({43: Action.DRAIN, 44: Action.RETIRE, 45: Action.APPLICATION}))
    first, second = host.state.node().cards[0].instances[:2]
    card = CardUuid(uuid(host, 0))
    assert await mig.on_event(GpuEvent(EventKind.XID, card, 94, first.uuid))
    assert await mig.on_event(GpuEvent(EventKind.XID, card, 43, second.uuid))
    assert not await mig.on_event(GpuEvent(EventKind.XID, card, 44, first.uuid))  # retire: the card's
    assert not await mig.on_event(GpuEvent(EventKind.XID, card, 43))  # names no instance: the card's
    assert await mig.on_event(GpuEvent(EventKind.XID, card, 45, first.uuid))  # the application's: nothing
    published = host.state.node().cards[0]
    assert published.healthy and host.state.book.of(card).health.value == "healthy"
    one, two, three = published.instances
    assert one.fault.startswith(f"XID 94 on {first.uuid}") and one.remedy is Remedy.NONE
    assert two.fault.startswith(f"XID 43 on {second.uuid}") and two.remedy is Remedy.DRAIN
    assert not three.fault
    with pytest.raises(FailedPrecondition, match=r"MIG .* at .*: the instance is unhealthy: XID 43"):
        await mig.make(ask(str(card), second.slot.profile, second.slot.start))
    assert mig.clear(card) and all(not i.fault for i in host.state.node().cards[0].instances)


async def test_without_remediation_a_drain_xid_faults_the_instance_and_moves_nobody() -> None:
    fake, gpus = opened()
    state = NodeState(NodeName("n1"), "fake", HealthBook(HealthPolicy(FaultPolicy({43: Action.DRAIN}))))
    state.apply_scan(gpus.scan(), 0.0)
    host = Host(gpus, state)
    mig = MigKeeper(host, MigConfig(fake), 60.0, Clock(), drains=False)
    first = state.node().cards[0].instances[0]
    assert await mig.on_event(GpuEvent(EventKind.XID, CardUuid(uuid(host, 0)), 43, first.uuid))
    hit = state.node().cards[0].instances[0]
    assert hit.fault.startswith("XID 43") and hit.remedy is Remedy.NONE
