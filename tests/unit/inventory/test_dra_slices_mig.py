"""A card in MIG mode published as partitionable devices (slices_mig, through slices.desired): one
device per placement, a counter set per card whose counters hold NVIDIA's layout rules, instances,
faults and holders outside DRA, the API's limits per slice, and the dropped-field check."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import pytest

from gpuledger_core.dra_mig import device_name, parse, profile_label, slot_of
from gpuledger_core.errors import FailedPrecondition, InvalidArgument
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.mig import model_of
from gpuledger_core.mig_layout import Placed, fits_at
from gpuledger_core.mig_profiles import A30_24GB, A100_40GB, H100_80GB, MigModel
from gpuledger_core.model import (
    Allocation,
    AllocState,
    Card,
    CardMode,
    CardShare,
    Grant,
    Health,
    MigInstance,
    MigSlot,
    Node,
    Owner,
    OwnerKind,
)
from gpuledger_inventory.slices import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    CardFacts,
    SliceConfig,
    Slices,
    check_returned,
    desired,
    manifest,
    plan,
)
from gpuledger_inventory.slices_mig import held_outside_dra

MODELS = {"NVIDIA A100-SXM4-40GB": (40960, A100_40GB), "NVIDIA A30": (24576, A30_24GB),
          "NVIDIA H100 80GB HBM3": (81920, H100_80GB)}  # fmt: skip
A100 = "NVIDIA A100-SXM4-40GB"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def mig_card(index: int = 0, *instances: MigInstance, model: str = A100, health: Health = Health.HEALTHY) -> Card:
    memory = MODELS[model][0]
    return Card(CardUuid(f"GPU-{index:08d}"), index, model, memory, minor=index, health=health,
                health_reason="XID 79" if health is Health.UNHEALTHY else "", mode=CardMode.MIG,
                instances=instances)  # fmt: skip


def whole_card(index: int) -> Card:
    return Card(CardUuid(f"GPU-{index:08d}"), index, A100, 40960, minor=index)


def slot(profile: str, start: int, model: MigModel = A100_40GB) -> MigSlot:
    found = model.by_name(profile)
    assert found is not None
    return MigSlot(profile, start, found.memory_slices)


def published(*cards: Card, facts: dict[str, CardFacts] | None = None, **config: Any) -> Slices:
    return desired(Node(NodeName("mig-0"), cards), facts or {}, "560.35.03", SliceConfig(**config))


def devices_of(slices: Slices) -> list[dict[str, Any]]:
    return [d for chunk in slices.chunks for d in chunk]


def by_name(slices: Slices) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in devices_of(slices)}


def counters_allow(chosen: Sequence[dict[str, Any]], counter_set: dict[str, Any]) -> bool:
    """What kube-scheduler checks: the chosen devices' consumption of each counter within its value."""
    used: dict[str, int] = {}
    for d in chosen:
        (consumed,) = d["consumesCounters"]
        for name, value in consumed["counters"].items():
            used[name] = used.get(name, 0) + int(value["value"])
    return all(int(counter_set["counters"][n]["value"]) >= v for n, v in used.items())


def layout_allows(model: MigModel, chosen: Sequence[dict[str, Any]], made: Sequence[Placed] = ()) -> bool:
    """NVIDIA's rules (mig_layout): each new placement fits beside the instances and those before it;
    a chosen instance that exists already is there."""
    taken = list(made)
    for d in chosen:
        profile = model.by_name(d["attributes"]["profile"]["string"])
        assert profile is not None
        start = d["attributes"]["migStart"]["int"]
        if (profile, start) in made:
            continue
        if not fits_at(model, profile, start, taken):
            return False
        taken.append((profile, start))
    return True


def test_a_card_in_mig_mode_is_one_device_per_placement_and_no_whole_card() -> None:
    found = published(mig_card(0))
    names = [d["name"] for d in devices_of(found)]
    expected = {device_name(0, p.name, s) for p in A100_40GB.profiles for s in p.starts}
    assert set(names) == expected and len(names) == len(expected) == 25
    assert "gpu-0" not in names
    assert names[0] == "gpu-0-mig-1g-5gb-6"  # smallest first, last start first
    assert names[-1] == "gpu-0-mig-7g-40gb-0"
    d = by_name(found)["gpu-0-mig-3g-20gb-4"]
    attrs = d["attributes"]
    assert attrs["profile"] == {"string": "3g.20gb"}
    assert (attrs["migStart"], attrs["migSize"], attrs["computeSlices"]) == ({"int": 4}, {"int": 4}, {"int": 3})
    assert attrs["uuid"] == {"string": "GPU-00000000"} and attrs["index"] == {"int": 0}
    assert attrs["minor"] == {"int": 0} and attrs["model"] == {"string": A100}
    assert attrs["memoryMiB"] == {"int": 19968} and "tenancy" not in attrs
    assert d["capacity"] == {"memory": {"value": "19968Mi"}, "compute": {"value": "42"}}  # 3 of 7 slices
    assert d["consumesCounters"] == [{"counterSet": "gpu-0-mig", "counters": {
        "memory-slice-4": {"value": "1"}, "memory-slice-5": {"value": "1"}, "memory-slice-6": {"value": "1"},
        "memory-slice-7": {"value": "1"}, "decoders": {"value": "2"}}}]  # fmt: skip
    assert "allowMultipleAllocations" not in d and "taints" not in d
    ((counters,),) = found.counters
    assert counters["name"] == "gpu-0-mig"
    assert counters["counters"] == {
        **{f"memory-slice-{k}": {"value": "1"} for k in range(8)},
        "decoders": {"value": "5"}, "jpegs": {"value": "1"}, "ofas": {"value": "1"},
        "count-1g-5gb-me": {"value": "1"},
    }  # fmt: skip


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_counters_allow_exactly_the_layouts_nvidias_rules_allow(model: str) -> None:
    """Every pair, triple and quadruple of placements of an empty card: kube-scheduler's counter
    check and the layout rules (placements, instance counts, media engines) agree."""
    found = published(mig_card(0, model=model))
    ((counters,),) = found.counters
    devices = devices_of(found)
    mig = MODELS[model][1]
    seen = set()
    for size in (2, 3, 4):
        for chosen in itertools.combinations(devices, size):
            allowed = counters_allow(chosen, counters)
            assert allowed == layout_allows(mig, chosen), [d["name"] for d in chosen]
            seen.add((size, allowed))
    assert seen == {(2, True), (2, False), (3, True), (3, False), (4, True), (4, False)}


def test_instances_that_exist_are_published_as_themselves_and_block_what_overlaps_them() -> None:
    three = MigInstance(slot("3g.20gb", 0), static=True, uuid="MIG-aaaa")
    media = MigInstance(slot("1g.5gb+me", 4), static=False, uuid="MIG-bbbb")
    found = published(mig_card(0, three, media))
    names = set(by_name(found))
    assert names == {"gpu-0-mig-3g-20gb-0", "gpu-0-mig-1g-5gb-me-4", "gpu-0-mig-1g-5gb-5",
                     "gpu-0-mig-1g-5gb-6", "gpu-0-mig-1g-10gb-6"}  # fmt: skip
    ((counters,),) = found.counters
    # What the instances hold of the engines is off the counters, and their devices consume none of it.
    assert counters["counters"]["decoders"] == {"value": "2"}  # 5 less 2 (3g) and 1 (1g+me)
    assert "ofas" not in counters["counters"] and "count-1g-5gb-me" not in counters["counters"]
    existing = by_name(found)["gpu-0-mig-3g-20gb-0"]["consumesCounters"][0]["counters"]
    assert set(existing) == {f"memory-slice-{k}" for k in range(4)}
    made = [(p, s) for p, s in ((A100_40GB.by_name(i.slot.profile), i.slot.start) for i in (three, media)) if p]
    devices = devices_of(found)
    for size in (1, 2, 3):
        for chosen in itertools.combinations(devices, size):
            assert counters_allow(chosen, counters) == layout_allows(A100_40GB, chosen, made)


def test_a_faulted_instance_and_an_unhealthy_card_are_tainted_not_removed() -> None:
    faulted = MigInstance(slot("1g.5gb", 6), uuid="MIG-cccc", fault="XID 94 in the instance")
    found = published(mig_card(0, faulted), mig_card(1, health=Health.UNHEALTHY),
                      facts={"GPU-00000001": CardFacts(unhealthy_since=1_800_000_000.0)})  # fmt: skip
    devices = by_name(found)
    (taint,) = devices["gpu-0-mig-1g-5gb-6"]["taints"]
    assert taint == {"key": "gpu.gpuledger.io/unhealthy", "value": "XID-94-in-the-instance", "effect": "NoSchedule"}
    assert all("taints" not in d for n, d in devices.items() if n.startswith("gpu-0-") and n != "gpu-0-mig-1g-5gb-6")
    sick = [d for n, d in devices.items() if n.startswith("gpu-1-")]
    assert len(sick) == 25
    assert all(d["taints"][0]["value"] == "XID-79" and d["taints"][0]["timeAdded"] == "2027-01-15T08:00:00Z"
               for d in sick)  # fmt: skip


def _holding(owner: Owner, card: Card, profile: str, start: int, at: float) -> Allocation:
    found = A100_40GB.by_name(profile)
    assert found is not None
    share = CardShare(card.uuid, card.index, found.memory_mib, 142, False, slot(profile, start))
    return Allocation(AllocationId(f"a-{owner.id}"), owner, NodeName("mig-0"), (Grant("", (share,)),),
                      state=AllocState.BOUND, created_at=at)  # fmt: skip


def test_placements_pods_or_tools_hold_taint_what_overlaps_them_and_what_no_longer_fits() -> None:
    card = mig_card(0)
    pod = _holding(Owner(OwnerKind.POD, "p"), card, "1g.5gb+me", 6, at=70.0)
    claim = _holding(Owner(OwnerKind.CLAIM, "c"), card, "3g.20gb", 0, at=10.0)
    held = held_outside_dra(NodeLedger(Node(NodeName("mig-0"), (card,)), (pod, claim)))
    assert held == {"GPU-00000000": ((slot("1g.5gb+me", 6), 70.0),)}  # a claim's is the scheduler's to count
    devices = by_name(published(card, facts={"GPU-00000000": CardFacts(mig_held=held["GPU-00000000"])}))
    tainted = {n for n, d in devices.items() if "taints" in d}
    overlapping = {"gpu-0-mig-1g-5gb-6", "gpu-0-mig-1g-5gb-me-6", "gpu-0-mig-1g-10gb-6",
                   "gpu-0-mig-3g-20gb-4", "gpu-0-mig-7g-40gb-0"}  # fmt: skip
    other_media = {f"gpu-0-mig-1g-5gb-me-{s}" for s in range(6)}  # the card's one OFA is held
    assert tainted == overlapping | other_media
    assert devices["gpu-0-mig-1g-5gb-6"]["taints"] == [
        {"key": "gpu.gpuledger.io/held", "value": "outside-dra", "effect": "NoSchedule",
         "timeAdded": "1970-01-01T00:01:10Z"}
    ]  # fmt: skip
    assert held_outside_dra(None) == {}


def test_cards_not_in_mig_mode_publish_as_before_beside_mig_cards() -> None:
    alone = published(whole_card(0), whole_card(2))
    mixed = published(whole_card(0), mig_card(1), whole_card(2))
    names = [d["name"] for d in devices_of(mixed)]
    assert names[:2] == ["gpu-0", "gpu-2"] and all(n.startswith("gpu-1-mig-") for n in names[2:])
    assert devices_of(mixed)[:2] == devices_of(alone)  # byte for byte
    assert not alone.counters and alone.count == 1


def test_a_card_in_mig_mode_whose_model_has_no_mig_publishes_nothing() -> None:
    odd = Card(CardUuid("GPU-x"), 0, "Tesla T4", 15360, mode=CardMode.MIG)
    found = published(odd)
    assert found.count == 0


def test_many_mig_cards_are_cut_to_the_apis_limits_and_no_slice_holds_devices_and_counters() -> None:
    cards = tuple(mig_card(i) for i in range(MAX_COUNTER_SETS_PER_SLICE + 1))
    found = published(*cards, binding_conditions=True)
    assert [len(c) for c in found.chunks] == [64, 64, 64, 33]  # 225 devices
    assert [len(c) for c in found.counters] == [8, 1]
    assert found.count == 6
    for n in range(found.count):
        spec = manifest(found, n, 2)["spec"]
        assert spec["pool"] == {"name": "mig-0", "generation": 2, "resourceSliceCount": 6}
        assert ("devices" in spec) != ("sharedCounters" in spec)
        for d in spec.get("devices", []):
            assert DNS_LABEL.fullmatch(d["name"]) and len(d["attributes"]) + len(d["capacity"]) <= 32
            assert len(d["consumesCounters"]) <= 2 and d["bindingConditions"] == ["gpuledger.io/committed"]
        for counter_set in spec.get("sharedCounters", []):
            assert DNS_LABEL.fullmatch(counter_set["name"]) and len(counter_set["counters"]) <= 32
            assert all(DNS_LABEL.fullmatch(c) for c in counter_set["counters"])
    assert MAX_DEVICES_PER_SLICE == 64


def test_a_new_instance_is_a_change_of_the_pool() -> None:
    owner = {"apiVersion": "v1", "kind": "Node", "name": "mig-0", "uid": "u"}
    before = published(mig_card(0))
    existing = [{**manifest(before, n, 3, owner), "metadata": {**manifest(before, n, 3, owner)["metadata"],
                 "resourceVersion": str(n)}} for n in range(before.count)]  # fmt: skip
    assert plan(existing, before, owner).empty
    after = published(mig_card(0, MigInstance(slot("1g.5gb", 6), static=False, uuid="MIG-dddd")))
    todo = plan(existing, after, owner)
    assert todo.generation == 4 and len(todo.update) == before.count and not todo.create


def test_a_dropped_counter_field_fails_naming_the_gate() -> None:
    found = published(mig_card(0))
    devices_slice, counters_slice = manifest(found, 0, 1), manifest(found, 1, 1)
    returned = {**counters_slice, "spec": {k: v for k, v in counters_slice["spec"].items() if k != "sharedCounters"}}
    with pytest.raises(FailedPrecondition, match=r"spec\.sharedCounters.*DRAPartitionableDevices"):
        check_returned(counters_slice, returned)
    stripped = [{k: v for k, v in d.items() if k != "consumesCounters"} for d in devices_slice["spec"]["devices"]]
    returned = {**devices_slice, "spec": {**devices_slice["spec"], "devices": stripped}}
    with pytest.raises(FailedPrecondition, match=r"spec\.devices\[0\]\.consumesCounters.*DRAPartitionableDevices"):
        check_returned(devices_slice, returned)


@pytest.mark.parametrize("profile", sorted({p.name for m in (A100_40GB, A30_24GB, H100_80GB) for p in m.profiles}))
def test_device_names_are_dns_labels_that_name_their_placement_back(profile: str) -> None:
    model = next(m for m in (A100_40GB, A30_24GB, H100_80GB) if m.by_name(profile))
    name_of_model = next(n for n, (_, m) in MODELS.items() if m is model)
    card = mig_card(3, model=name_of_model)
    found = model.by_name(profile)
    assert found is not None and model_of(card) is model
    for start in found.starts:
        name = device_name(3, profile, start)
        assert DNS_LABEL.fullmatch(name) and parse(name) == (3, profile_label(profile), start)
        assert slot_of(card, name) == MigSlot(profile, start, found.memory_slices)


@pytest.mark.parametrize(
    ("name", "why"),
    [("gpu-3", "no MIG placement of card 3"), ("gpu-2-mig-1g-5gb-6", "no MIG placement of card 3"),
     ("gpu-3-mig-9g-90gb-0", "has no MIG placement 9g-90gb at 0"), ("gpu-3-mig-3g-20gb-2", "at 2")],
)  # fmt: skip
def test_a_device_that_is_no_placement_of_the_card_is_refused_naming_it(name: str, why: str) -> None:
    with pytest.raises(InvalidArgument, match=why):
        slot_of(mig_card(3), name)
