"""The ledger holds MIG: a card in MIG mode is a set of placements, each held whole by one holder;
a share or a whole card never goes on it, a MIG instance never on another card; the mode changes
only while the card is empty (gpuledger_core.mig, ledger.reserve, ledger.set_mode)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from gpuledger_core import codec
from gpuledger_core.errors import Exhausted, FailedPrecondition, InvalidArgument
from gpuledger_core.ledger import NodeLedger, release, reserve, set_mode
from gpuledger_core.mig import (
    PROFILES,
    free_instances,
    free_starts,
    held_slots,
    model_of,
    profile_of_resource,
    reclaimed,
    request_of,
    resource_of,
    share_of,
    smallest,
)
from gpuledger_core.mig_profiles import A30_24GB, A100_40GB, H100_80GB, MigModel
from gpuledger_core.model import MIG_SMALLEST, Card, CardMode, CardShare, MigInstance, MigSlot, Node, Remedy, Request
from tests.unit.core.builders import NODE, card, holding, share, whole

A100 = "NVIDIA A100-SXM4-40GB"


def mig_card(index: int = 0, *instances: MigInstance, model: str = A100, memory: int = 40960) -> Card:
    return replace(card(index, memory, model=model), mode=CardMode.MIG, instances=instances)


def mig_ledger(*cards: Card) -> NodeLedger:
    return NodeLedger(Node(NODE, cards))


def slot(profile: str, start: int) -> MigSlot:
    p = A100_40GB.by_name(profile)
    assert p is not None
    return MigSlot(profile, start, p.memory_slices)


def instance_share(c: Card, profile: str, start: int) -> CardShare:
    p = A100_40GB.by_name(profile)
    assert p is not None
    return share_of(c, p, start)


def test_a_mig_instance_is_held_whole_by_one_holder() -> None:
    c = mig_card()
    ledger = reserve(mig_ledger(c), holding("a", instance_share(c, "3g.20gb", 4)))
    with pytest.raises(Exhausted, match=r"card 0 .*3g.20gb at 4 overlaps 3g.20gb at 4, which is held"):
        reserve(ledger, holding("b", instance_share(c, "3g.20gb", 4)))
    with pytest.raises(Exhausted, match=r"1g.5gb at 5 overlaps 3g.20gb at 4"):
        reserve(ledger, holding("c", instance_share(c, "1g.5gb", 5)))
    assert reserve(ledger, holding("d", instance_share(c, "3g.20gb", 0))).get("d") is not None  # type: ignore[arg-type]


def test_released_instances_free_their_placement() -> None:
    c = mig_card()
    ledger = reserve(mig_ledger(c), holding("a", instance_share(c, "7g.40gb", 0)))
    ledger = release(ledger, "a", 1.0)  # type: ignore[arg-type]
    assert held_slots(ledger.allocations, c) == []
    reserve(ledger, holding("b", instance_share(c, "1g.5gb", 3)))


def test_a_share_or_a_whole_card_never_goes_on_a_mig_card() -> None:
    c = mig_card()
    with pytest.raises(Exhausted, match=r"in MIG mode: it takes MIG instances only"):
        reserve(mig_ledger(c), holding("a", share(0, 1000, 100)))
    with pytest.raises(Exhausted, match=r"in MIG mode"):
        reserve(mig_ledger(c), holding("a", whole(c)))


def test_a_mig_instance_never_goes_on_a_card_that_is_not_in_mig_mode() -> None:
    plain = card(0, 40960, model=A100)
    with pytest.raises(Exhausted, match=r"is in whole mode, not MIG"):
        reserve(mig_ledger(plain), holding("a", instance_share(plain, "1g.5gb", 0)))


@pytest.mark.parametrize(
    ("wanted", "problem"),
    [
        (MigSlot("1g.6gb", 0, 1), "offers no MIG profile 1g.6gb"),  # an A30 profile on an A100
        (MigSlot("3g.20gb", 2, 4), "has no placement at 2 of size 4"),  # 3g starts at 0 or 4
        (MigSlot("1g.10gb", 1, 2), "has no placement at 1 of size 2"),  # 1g.10gb starts even
        (MigSlot("2g.10gb", 0, 1), "has no placement at 0 of size 1"),  # wrong size
    ],
)
def test_a_placement_the_model_does_not_offer_is_refused(wanted: MigSlot, problem: str) -> None:
    c = mig_card()
    bad = CardShare(c.uuid, c.index, 1, 1, mig=wanted)
    with pytest.raises(Exhausted, match=problem):
        reserve(mig_ledger(c), holding("a", bad))


def test_the_media_engines_are_nvidias() -> None:
    c = mig_card()
    ledger = reserve(mig_ledger(c), holding("me", instance_share(c, "1g.5gb+me", 0)))
    with pytest.raises(Exhausted, match=r"no more 1g.5gb\+me fit"):  # one +me instance per card
        reserve(ledger, holding("me2", instance_share(c, "1g.5gb+me", 1)))
    reserve(ledger, holding("plain", instance_share(c, "1g.5gb", 1)))


def test_a_static_instance_is_taken_as_it_is_and_nothing_overlapping_it() -> None:
    made = MigInstance(slot("3g.20gb", 4), static=True, uuid="MIG-aaaa")
    c = mig_card(0, made)
    ledger = reserve(mig_ledger(c), holding("a", instance_share(c, "3g.20gb", 4)))
    assert free_instances(c, held_slots(ledger.allocations, c), "3g.20gb") == []
    with pytest.raises(Exhausted, match=r"overlaps the static instance 3g.20gb at 4"):
        reserve(mig_ledger(c), holding("b", instance_share(c, "1g.5gb", 4)))
    with pytest.raises(Exhausted, match=r"overlaps the static instance 3g.20gb at 4"):
        reserve(mig_ledger(c), holding("b", instance_share(c, "7g.40gb", 0)))


def test_free_instances_and_free_starts_count_instances_and_holders() -> None:
    c = mig_card(0, MigInstance(slot("1g.5gb", 0)), MigInstance(slot("1g.5gb", 1), static=False))
    held = [slot("1g.5gb", 1), slot("2g.10gb", 2)]
    assert free_instances(c, held, "1g.5gb") == [slot("1g.5gb", 0)]
    model = model_of(c)
    assert model is A100_40GB
    one = A100_40GB.by_name("1g.5gb")
    assert one is not None
    assert free_starts(c, model, one, held) == [4, 5, 6]


def test_an_unheld_instance_made_on_demand_gives_way_to_a_placement_over_it_a_static_one_never() -> None:
    kept = MigInstance(slot("1g.5gb", 0), static=False, uuid="MIG-kept")  # its holder gone, kept for reuse
    fixed = MigInstance(slot("1g.5gb", 4), static=True, uuid="MIG-fixed")
    c = mig_card(0, kept, fixed)
    model = model_of(c)
    two, three = A100_40GB.by_name("2g.10gb"), A100_40GB.by_name("3g.20gb")
    assert model is not None and two is not None and three is not None
    assert free_starts(c, model, two, []) == [0, 2]  # over the kept 1g.5gb at 0, not the static one at 4
    assert free_starts(c, model, three, []) == [0]
    assert reclaimed(c, [], slot("2g.10gb", 0)) == {kept.slot}
    assert reclaimed(c, [], slot("1g.5gb", 0)) == frozenset()  # taken as it is
    ledger = reserve(mig_ledger(c), holding("a", instance_share(c, "2g.10gb", 0)))
    assert free_instances(c, held_slots(ledger.allocations, c), "1g.5gb") == [fixed.slot]  # not the one under a
    with pytest.raises(Exhausted, match=r"1g.5gb at 0 overlaps 2g.10gb at 0, which is held"):
        reserve(ledger, holding("b", instance_share(c, "1g.5gb", 0)))
    held = reserve(mig_ledger(c), holding("c", instance_share(c, "1g.5gb", 0)))  # held again: in the way
    with pytest.raises(Exhausted, match=r"2g.10gb at 0 overlaps 1g.5gb at 0, which is held"):
        reserve(held, holding("d", instance_share(c, "2g.10gb", 0)))


def test_two_instances_of_one_allocation_on_one_card_may_not_overlap_each_other() -> None:
    c = mig_card()
    twice = holding("a", instance_share(c, "3g.20gb", 0), instance_share(c, "4g.20gb", 0))
    with pytest.raises(Exhausted, match=r"overlaps 3g.20gb at 0, which is held"):
        reserve(mig_ledger(c), twice)
    both = holding("b", instance_share(c, "3g.20gb", 0), instance_share(c, "3g.20gb", 4))
    assert len(held_slots(reserve(mig_ledger(c), both).allocations, c)) == 2


def test_an_unhealthy_mig_card_takes_no_instance() -> None:
    c = replace(mig_card(), health=card(0, healthy=False).health)
    with pytest.raises(Exhausted, match=r"is unhealthy"):
        reserve(mig_ledger(c), holding("a", instance_share(c, "1g.5gb", 0)))


def test_mig_mode_changes_only_on_an_empty_card() -> None:
    plain = card(0, 40960, model=A100)
    ledger = reserve(mig_ledger(plain), holding("a", share(0, 1000, 100)))
    with pytest.raises(FailedPrecondition, match=r"has 1 holder.*only when it is empty"):
        set_mode(ledger, plain.uuid, CardMode.MIG)
    emptied = release(ledger, "a", 1.0)  # type: ignore[arg-type]
    mig = set_mode(emptied, plain.uuid, CardMode.MIG)
    assert mig.node.cards[0].mode is CardMode.MIG
    assert set_mode(mig, plain.uuid, CardMode.MIG) is mig
    held = reserve(mig, holding("b", instance_share(mig.node.cards[0], "1g.5gb", 0)))
    with pytest.raises(FailedPrecondition, match=r"only when it is empty"):
        set_mode(held, plain.uuid, CardMode.WHOLE)
    with_instance = mig_ledger(mig_card(0, MigInstance(slot("1g.5gb", 0))))
    with pytest.raises(FailedPrecondition, match=r"1 MIG instance.*destroy them first"):
        set_mode(with_instance, plain.uuid, CardMode.WHOLE)


def test_cards_not_in_mig_mode_beside_a_mig_card_keep_their_rules() -> None:
    c, plain = mig_card(0), card(1, 40960, model=A100)
    ledger = reserve(mig_ledger(c, plain), holding("a", instance_share(c, "1g.5gb", 0), share(1, 1000, 100)))
    ledger = reserve(ledger, holding("b", share(1, 1000, 100)))
    with pytest.raises(Exhausted, match=r"card 1 .* is held by 2 other"):
        reserve(ledger, holding("c", whole(plain)))


@pytest.mark.parametrize(
    ("model", "mem", "core", "profile"),
    [
        (A100_40GB, 4000, None, "1g.5gb"),
        (A100_40GB, 4864, None, "1g.5gb"),
        (A100_40GB, 4865, None, "1g.10gb"),  # the 1g with two memory slices before the 2g
        (A100_40GB, 9000, 200, "2g.10gb"),  # 20 % is more than one seventh
        (A100_40GB, None, 143, "2g.10gb"),  # 1/7 = 142.9 per-mille: 143 wants two slices
        (A100_40GB, None, 142, "1g.5gb"),
        (A100_40GB, 15000, None, "3g.20gb"),
        (A100_40GB, 15000, 500, "4g.20gb"),
        (A100_40GB, 30000, None, "7g.40gb"),
        (A100_40GB, 50000, None, None),
        (A30_24GB, 6000, None, "2g.12gb"),
        (H100_80GB, 12000, None, "1g.20gb"),
    ],
)
def test_the_smallest_profile_that_holds_memory_and_compute(
    model: MigModel, mem: int, core: int | None, profile: str | None
) -> None:
    found = smallest(model, mem, core)
    assert (found.name if found else None) == profile


def test_the_smallest_profile_never_takes_media_engines_unless_named() -> None:
    for model in (A100_40GB, A30_24GB, H100_80GB):
        for mem in range(1000, model.whole.memory_mib, 1000):
            found = smallest(model, mem, None)
            assert found is not None and not found.name.endswith("+me")


def test_a_mig_request_names_a_profile_or_memory_and_compute_never_both() -> None:
    assert not Request(mig="1g.10gb").exclusive
    assert not Request(mem_mib=1000, mig=MIG_SMALLEST).exclusive
    with pytest.raises(InvalidArgument, match=r"names its memory and compute"):
        Request(mem_mib=1000, mig="1g.10gb")
    with pytest.raises(InvalidArgument, match=r"needs gpu-mem or gpu-core"):
        Request(mig=MIG_SMALLEST)


def test_mig_fields_are_written_only_when_set() -> None:
    plain = mig_ledger(card(0, 40960, model=A100))
    raw = codec.ledger_to(reserve(plain, holding("a", share(0, 1000, 100))))
    assert raw["schema"] == codec.SCHEMA == 1
    assert "mode" not in raw["node"]["cards"][0] and "instances" not in raw["node"]["cards"][0]
    assert "mig" not in raw["allocations"][0]["grants"][0]["cards"][0]
    assert "mig" not in codec.request_to(Request(mem_mib=5))


def test_a_mig_ledger_round_trips_in_schema_2() -> None:
    c = mig_card(0, MigInstance(slot("3g.20gb", 4), static=True, uuid="MIG-x"), MigInstance(slot("1g.5gb", 0), False))
    ledger = reserve(mig_ledger(c), holding("a", instance_share(c, "3g.20gb", 4)))
    ledger = replace(
        ledger,
        allocations=tuple(
            replace(a, requests=(Request(mig="3g.20gb"), Request(mem_mib=9, mig=MIG_SMALLEST)))
            for a in ledger.allocations
        ),
    )
    raw = codec.ledger_to(ledger)
    assert raw["schema"] == codec.MIG_SCHEMA == 2
    assert raw["node"]["cards"][0]["mode"] == "mig"
    back = codec.ledger_from(raw)
    assert back == ledger
    assert back.node.cards[0].instances[0].uuid == "MIG-x" and not back.node.cards[0].instances[1].static


def test_a_value_without_mig_fields_decodes_as_a_card_of_before() -> None:
    raw = codec.ledger_to(mig_ledger(card(0)))
    assert codec.ledger_from(raw).node.cards[0].mode is CardMode.WHOLE
    raw["node"]["cards"][0]["mode"] = "partitioned"
    with pytest.raises(InvalidArgument, match=r"node.cards\[0\].mode: must be one of whole\|mig"):
        codec.ledger_from(raw)


def test_a_container_names_a_profile_by_its_resource() -> None:
    assert request_of({"gpuledger.io/mig-1g.10gb": 2}, None, None) == Request(2, mig="1g.10gb")
    assert request_of({"gpuledger.io/mig-1g.10gb": 0}, None, None) is None
    models = frozenset({"A100"})
    assert request_of({"gpuledger.io/mig": 1}, 8000, 200, models) == Request(1, 8000, 200, models, mig=MIG_SMALLEST)


def test_a_media_extension_profile_is_asked_with_a_dot_since_a_resource_name_has_no_plus() -> None:
    assert resource_of("1g.10gb+me") == "gpuledger.io/mig-1g.10gb.me"
    assert resource_of("3g.40gb") == "gpuledger.io/mig-3g.40gb"
    assert request_of({"gpuledger.io/mig-1g.10gb.me": 1}, None, None) == Request(1, mig="1g.10gb+me")
    assert all(profile_of_resource(resource_of(p)) == p for p in PROFILES)


@pytest.mark.parametrize(
    ("counts", "mem", "problem"),
    [
        (
            {"gpuledger.io/mig-9g.90gb": 1},
            None,
            "gpuledger.io/mig-9g.90gb: no card model offers the MIG profile 9g.90gb",
        ),
        ({"gpuledger.io/mig-": 1}, None, "no card model offers the MIG profile (none named)"),
        ({"gpuledger.io/mig-1g.10gb": 1}, 1000, "names its memory and compute"),
        ({"gpuledger.io/mig": 1}, None, "sizes its instances by gpuledger.io/gpu-mem"),
        ({"gpuledger.io/mig": 1, "gpuledger.io/mig-1g.10gb": 1}, 10, "one MIG resource per container"),
    ],
)
def test_a_mig_resource_that_makes_no_sense_is_refused_by_name(
    counts: dict[str, int], mem: int | None, problem: str
) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(problem)):
        request_of(counts, mem, None)


def test_a_faulted_instance_takes_no_holder_and_the_card_s_others_still_do() -> None:
    bad = MigInstance(slot("1g.5gb", 0), static=True, uuid="MIG-bad", fault="XID 43 in the instance")
    good = MigInstance(slot("1g.5gb", 1), static=True, uuid="MIG-good")
    c = mig_card(2, bad, good)
    with pytest.raises(Exhausted, match=r"MIG instance 1g.5gb@0 on card 2 is unhealthy: XID 43 in the instance"):
        reserve(mig_ledger(c), holding("a", instance_share(c, "1g.5gb", 0)))
    assert reserve(mig_ledger(c), holding("b", instance_share(c, "1g.5gb", 1))).get("b") is not None  # type: ignore[arg-type]
    assert free_instances(c, [], "1g.5gb") == [good.slot]
    with pytest.raises(Exhausted, match=r"overlaps the static instance 1g.5gb at 0"):
        reserve(mig_ledger(c), holding("c", instance_share(c, "2g.10gb", 0)))


def test_an_instance_s_fault_is_written_only_when_set_and_round_trips() -> None:
    healthy = MigInstance(slot("1g.5gb", 0), static=False, uuid="MIG-a")
    faulted = MigInstance(slot("1g.5gb", 1), True, "MIG-b", "XID 48 (double bit ECC)", Remedy.DRAIN)
    raw = codec.ledger_to(mig_ledger(mig_card(0, healthy, faulted)))
    written = raw["node"]["cards"][0]["instances"]
    assert "fault" not in written[0] and "remedy" not in written[0]
    assert (written[1]["fault"], written[1]["remedy"]) == ("XID 48 (double bit ECC)", "drain")
    assert codec.ledger_from(raw).node.cards[0].instances == (healthy, faulted)
    written[1]["fault"] = 48
    with pytest.raises(InvalidArgument, match=r"node.cards\[0\].instances\[1\].fault: has the wrong type int"):
        codec.ledger_from(raw)


def test_a_card_value_without_the_mig_fields_decodes_whole_and_with_them_mig() -> None:
    raw = codec.card_to(mig_card(0, MigInstance(slot("7g.40gb", 0))))
    assert codec.card_from(codec.Reader(raw)).instances == (MigInstance(slot("7g.40gb", 0)),)
    del raw["mode"]
    assert codec.card_from(codec.Reader(raw)).mode is CardMode.WHOLE
    del raw["instances"]
    assert codec.card_from(codec.Reader(raw)) == card(0, 40960, model=A100)
