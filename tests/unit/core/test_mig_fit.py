"""The one MIG fit (gpuledger_core.mig_fit) and ``fit.fit_node`` routing MIG requests to it: a table
of the cases that matter, and hypothesis properties over random nodes (cards in MIG mode or not,
instances, holders) and requests: every share it returns is one ``ledger.reserve`` takes, never on a
card not in MIG mode, one per card; a refusal names the node and the profile."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, reservation, reserve
from gpuledger_core.mig import share_of
from gpuledger_core.mig_fit import asked, fit_mig, mig_score
from gpuledger_core.mig_layout import LayoutError, place_all
from gpuledger_core.mig_place import MigChooser, MigWorkload
from gpuledger_core.mig_profiles import A30_24GB, A100_40GB, GiProfile, MigModel
from gpuledger_core.model import (
    MIG_SMALLEST,
    Allocation,
    Card,
    CardMode,
    CardShare,
    Grant,
    Health,
    Isolation,
    MigInstance,
    MigSlot,
    Node,
    Owner,
    OwnerKind,
    Request,
)
from gpuledger_core.slots import assign_device_ids
from tests.unit.core.builders import NODE, card, holding

NAMES = {A100_40GB.name: "NVIDIA A100-SXM4-40GB", A30_24GB.name: "NVIDIA A30"}
MEMORY = {A100_40GB.name: 40960, A30_24GB.name: 24576}
TOOL = Owner(OwnerKind.TOOL, "t-1")


def mig_card(index: int, *instances: MigInstance, model: MigModel = A100_40GB) -> Card:
    plain = card(index, MEMORY[model.name], model=NAMES[model.name])
    return replace(plain, mode=CardMode.MIG, instances=instances)


def slot(name: str, start: int, model: MigModel = A100_40GB) -> MigSlot:
    p = model.by_name(name)
    assert p is not None
    return MigSlot(name, start, p.memory_slices)


def mig_share(c: Card, name: str, start: int) -> CardShare:
    p = A100_40GB.by_name(name)
    assert p is not None
    return share_of(c, p, start)


def holder(allocation_id: str, c: Card, name: str, start: int) -> Allocation:
    return holding(allocation_id, mig_share(c, name, start))


def ledger_of(*cards: Card, holders: tuple[Allocation, ...] = ()) -> NodeLedger:
    ledger = NodeLedger(Node(NODE, cards))
    for h in holders:
        ledger = reserve(ledger, h)
    return ledger


def test_an_instance_of_a_named_profile_on_the_card_in_mig_mode() -> None:
    ledger = ledger_of(card(0, 40960, model=NAMES[A100_40GB.name]), mig_card(1))
    (found,) = fit_mig(ledger, Request(mig="1g.5gb"), MigChooser())
    assert (found.index, found.mig) == (1, slot("1g.5gb", 6))
    assert found == mig_share(found_card(ledger, 1), "1g.5gb", 6)
    assert (found.core_milli, found.exclusive) == (142, False)


def test_the_smallest_profile_holding_the_memory() -> None:
    ledger = ledger_of(mig_card(0))
    (found,) = fit_mig(ledger, Request(mem_mib=8000, mig=MIG_SMALLEST), MigChooser())
    assert found.mig is not None and found.mig.profile == "1g.10gb"
    (a30,) = fit_mig(ledger_of(mig_card(0, model=A30_24GB)), Request(mem_mib=8000, mig=MIG_SMALLEST), MigChooser())
    assert a30.mig is not None and a30.mig.profile == "2g.12gb"


def test_a_free_instance_is_taken_before_a_new_one() -> None:
    made = MigInstance(slot("3g.20gb", 4), static=True)
    ledger = ledger_of(mig_card(0), mig_card(1, made))
    (found,) = fit_mig(ledger, Request(mig="3g.20gb"), MigChooser(MigWorkload.of(["3g.20gb"])))
    assert (found.index, found.mig) == (1, made.slot)


def test_count_instances_go_on_distinct_cards() -> None:
    ledger = ledger_of(mig_card(0), mig_card(1), mig_card(2))
    found = fit_mig(ledger, Request(count=2, mig="1g.5gb"), MigChooser())
    assert len({s.uuid for s in found}) == 2


def test_what_live_holders_and_the_owner_took_is_held() -> None:
    c = mig_card(0)
    ledger = ledger_of(c, holders=(holder("a", c, "4g.20gb", 0),))
    (first,) = fit_mig(ledger, Request(mig="2g.10gb"), MigChooser())
    assert first.mig == slot("2g.10gb", 4)
    (second,) = fit_mig(ledger, Request(mig="1g.5gb"), MigChooser(), taken=(first,))
    assert second.mig == slot("1g.5gb", 6)
    with pytest.raises(Exhausted, match=r"node-a: no free placement of MIG 1g.5gb: card 0 full"):
        fit_mig(ledger, Request(mig="1g.5gb"), MigChooser(), taken=(first, second))


def test_no_card_in_mig_mode_is_refused_naming_node_and_profile() -> None:
    ledger = ledger_of(card(0, 40960), card(1, 40960))
    with pytest.raises(
        Exhausted, match=r"^node-a: no card in MIG mode for MIG 1g.10gb \(cards 0 and 1 in whole mode\)$"
    ):
        fit_mig(ledger, Request(mig="1g.10gb"), MigChooser())


def test_other_refusals_name_what_is_short() -> None:
    sick = replace(mig_card(0), health=Health.UNHEALTHY)
    with pytest.raises(Exhausted, match=r"node-a: MIG 1g.5gb: card 0 unhealthy"):
        fit_mig(ledger_of(sick), Request(mig="1g.5gb"), MigChooser())
    with pytest.raises(Exhausted, match=r"no card in MIG mode offers MIG 1g.6gb \(NVIDIA A100-SXM4-40GB\)"):
        fit_mig(ledger_of(mig_card(0)), Request(mig="1g.6gb"), MigChooser())
    with pytest.raises(Exhausted, match=r"no card in MIG mode offers MIG the smallest profile holding 90000 MiB"):
        fit_mig(ledger_of(mig_card(0)), Request(mem_mib=90000, mig=MIG_SMALLEST), MigChooser())
    with pytest.raises(Exhausted, match=r"MIG 1g.5gb: 1 of the 2 instances found room, one per card"):
        fit_mig(ledger_of(mig_card(0)), Request(count=2, mig="1g.5gb"), MigChooser())
    with pytest.raises(Exhausted, match=r"no card of model NVIDIA A30 for MIG 1g.5gb"):
        fit_mig(ledger_of(mig_card(0)), Request(mig="1g.5gb", models=frozenset({"NVIDIA A30"})), MigChooser())


def test_slots_used_up_refuse_a_card() -> None:
    c = mig_card(0)
    ledger = ledger_of(c, holders=(holder("a", c, "1g.5gb", 0),))
    with pytest.raises(Exhausted, match=r"card 0 with all 1 kubelet slots taken \(slots used up\)"):
        fit_mig(ledger, Request(mig="1g.5gb"), MigChooser(), slots_per_card=1)
    assert fit_mig(ledger, Request(mig="1g.5gb"), MigChooser(), slots_per_card=2)


def test_a_request_without_mig_is_not_for_fit_mig() -> None:
    with pytest.raises(ValueError, match="MIG requests only"):
        fit_mig(ledger_of(mig_card(0)), Request(), MigChooser())


def test_the_score_prefers_the_layout_that_keeps_the_most_for_the_workload() -> None:
    """A 2g.10gb beside a workload of 4g.20gb: on the card whose first half is broken already it
    costs nothing of the 4g's room; on the empty card, at 4, it costs what it takes of 2g's own."""
    broken, empty = mig_card(0), mig_card(1)
    ledger = ledger_of(broken, empty, holders=(holder("a", broken, "1g.5gb", 0),))
    chooser = MigChooser(MigWorkload.of(["4g.20gb"] * 3 + ["2g.10gb"]))
    on_broken, on_empty = mig_share(broken, "2g.10gb", 2), mig_share(empty, "2g.10gb", 4)
    assert mig_score(ledger, [on_broken], chooser) > mig_score(ledger, [on_empty], chooser)
    (chosen,) = fit_mig(ledger, Request(mig="2g.10gb"), chooser)
    assert chosen.index == 0


def test_fit_node_routes_mig_containers_and_each_sees_the_others() -> None:
    c = mig_card(0)
    ledger = ledger_of(c)
    asks = [ContainerAsk("a", Request(mig="3g.20gb")), ContainerAsk("b", Request(mig="4g.20gb"))]
    grants = fit_node(ledger, asks, slots_per_card=8)
    slots = [s.mig for g in grants for s in g.cards]
    assert slots == [slot("3g.20gb", 4), slot("4g.20gb", 0)]
    reserve(ledger, assign_device_ids(ledger, planned(ledger, grants), 8))  # the ledger takes them


def found_card(ledger: NodeLedger, index: int) -> Card:
    return ledger.node.cards[index]


def planned(ledger: NodeLedger, grants: tuple[Grant, ...], allocation_id: str = "x") -> Allocation:
    """A tool's reservation of ``grants`` (its requests are not what is checked here)."""
    return reservation(AllocationId(allocation_id), TOOL, NODE, grants, [], isolation=Isolation.NONE, now=0, lease_s=60)


MODELS = (A100_40GB, A30_24GB)
FAULTS = ("", "", "XID 43")
ASKED = sorted({p.name for m in MODELS for p in m.profiles})


@st.composite
def any_card(draw: st.DrawFn, index: int) -> Card:
    """A card of a MIG model, in whole mode or in MIG mode with a layout that fits (some instances
    static, some faulted)."""
    model = draw(st.sampled_from(MODELS))
    if not draw(st.booleans()):
        return card(index, MEMORY[model.name], model=NAMES[model.name])
    profiles: list[GiProfile] = []
    for name in draw(st.lists(st.sampled_from([p.name for p in model.profiles]), max_size=4)):
        found = model.by_name(name)
        assert found is not None
        try:
            place_all(model, [*profiles, found])
        except LayoutError:
            continue
        profiles.append(found)
    starts = place_all(model, profiles)
    instances = tuple(
        MigInstance(
            MigSlot(p.name, s, p.memory_slices),
            static=draw(st.booleans()),
            fault=draw(st.sampled_from(("", "", "XID 43"))),
        )
        for p, s in zip(profiles, starts, strict=True)
    )
    return mig_card(index, *instances, model=model)


@st.composite
def any_request(draw: st.DrawFn) -> Request:
    count = draw(st.integers(1, 2))
    if draw(st.booleans()):
        return Request(count, mig=draw(st.sampled_from(ASKED)))
    return Request(count, mem_mib=draw(st.integers(1000, 50000)), mig=MIG_SMALLEST)


nodes = st.integers(1, 3).flatmap(lambda n: st.tuples(*(any_card(i) for i in range(n))))


@settings(max_examples=150, deadline=None)
@given(nodes, st.lists(any_request(), min_size=1, max_size=8), st.sampled_from((None, 2, 8)))
def test_every_fit_is_one_the_ledger_takes(cards: tuple[Card, ...], requests: list[Request], spc: int | None) -> None:
    ledger = ledger_of(*cards)
    for at, request in enumerate(requests):
        try:
            found = fit_mig(ledger, request, MigChooser(), spc)
        except Exhausted as err:
            assert str(err).startswith(f"{NODE}: ") and asked(request) in str(err)
            continue
        assert len(found) == request.count == len({s.uuid for s in found})
        for share in found:
            c = ledger.node.card(share.uuid)
            assert c is not None and c.mig and share.mig is not None
        allocation = planned(ledger, (Grant("main", found),), f"a-{at}")
        ledger = reserve(ledger, assign_device_ids(ledger, allocation, spc or 8))


@settings(max_examples=100, deadline=None)
@given(nodes, st.lists(any_request(), min_size=1, max_size=3))
def test_an_owners_containers_each_see_the_others(cards: tuple[Card, ...], requests: list[Request]) -> None:
    ledger = ledger_of(*cards)
    asks = [ContainerAsk(f"c{i}", r) for i, r in enumerate(requests)]
    try:
        grants = fit_node(ledger, asks, slots_per_card=8)
    except Exhausted as err:
        assert str(err).startswith(f"{NODE}: ")
        return
    for grant in grants:
        assert len({s.uuid for s in grant.cards}) == len(grant.cards)
        assert all((c := ledger.node.card(s.uuid)) is not None and c.mig for s in grant.cards)
    reserve(ledger, assign_device_ids(ledger, planned(ledger, grants), 8))
