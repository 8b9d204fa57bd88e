"""A pod's cards on one node: planning per container, device IDs, model selectors, what never fits."""

from __future__ import annotations

from collections import Counter

import pytest

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Owner, OwnerKind, Request
from gpuledger_core.packing import Ask, from_ledger, make_policy
from gpuledger_core.pods import PodAsk, expand_models, impossible, plan, reserve_pod
from gpuledger_core.slots import card_of

from .builders import ledger

OWNER = Owner(OwnerKind.POD, "uid-1", "ns", "p")
POLICY = make_policy("bestfit")


def pod(*containers: ContainerAsk) -> PodAsk:
    return PodAsk(OWNER, containers)


def test_app_containers_add_up_on_the_node() -> None:
    two = pod(ContainerAsk("a", Request(1, mem_mib=6000)), ContainerAsk("b", Request(1, mem_mib=6000)))
    grants = plan(ledger(8000, 8000), two, POLICY, slots_per_card=8)
    assert {g.cards[0].index for g in grants} == {0, 1}  # 12000 MiB do not fit one 8000 MiB card
    with pytest.raises(Exhausted, match="container b"):
        plan(ledger(8000), two, POLICY, slots_per_card=8)


def test_an_init_container_is_placed_on_the_node_as_it_is() -> None:
    with_init = pod(
        ContainerAsk("init", Request(1, mem_mib=7000), init=True), ContainerAsk("app", Request(1, mem_mib=7000))
    )
    grants = plan(ledger(8000), with_init, POLICY, slots_per_card=8)
    assert [(g.container, g.init, g.cards[0].index) for g in grants] == [("init", True, 0), ("app", False, 0)]


def test_reserve_pod_assigns_device_ids_in_the_same_transition() -> None:
    with_init = pod(ContainerAsk("init", Request(1), init=True), ContainerAsk("app", Request(2)))
    after = reserve_pod(
        ledger(8000, 8000), with_init, POLICY, AllocationId("a-1"), now=10.0, lease_s=30.0, slots_per_card=4
    )
    [allocation] = after.allocations
    assert allocation.lease_expires_at == 40.0 and allocation.owner == OWNER
    init, app = allocation.grants
    assert [card_of(i) for i in app.device_ids] == [s.uuid for s in app.cards]
    assert set(init.device_ids) <= set(app.device_ids)  # kubelet reuses the app container's devices
    with pytest.raises(Exhausted):
        reserve_pod(
            after, pod(ContainerAsk("x", Request(1))), POLICY, AllocationId("a-2"), now=10, lease_s=30, slots_per_card=4
        )


def test_the_last_free_slot_limits_holders_per_card() -> None:
    small = pod(ContainerAsk("c", Request(1, mem_mib=10)))
    current = ledger(8000)
    for n in range(2):
        current = reserve_pod(current, small, POLICY, AllocationId(f"a-{n}"), now=0, lease_s=9, slots_per_card=2)
    with pytest.raises(Exhausted, match="slots used up"):
        reserve_pod(current, small, POLICY, AllocationId("a-3"), now=0, lease_s=9, slots_per_card=2)


def small_shares(count: int) -> list[PodAsk]:
    small = (ContainerAsk("c", Request(1, mem_mib=100, core_milli=10)),)
    return [PodAsk(Owner(OwnerKind.POD, f"uid-{n}", "ns", f"p{n}"), small) for n in range(count)]


@pytest.mark.parametrize("policy", ["bestfit", "binpack", "default", "fgd", "gpupacking", "spread"])
def test_small_shares_spread_to_the_next_card_when_slots_run_out(policy: str) -> None:
    # Two cards with 8 slots each: the ninth small share goes to card 1, not refused on card 0.
    current = ledger(80000, 80000)
    for n, pod_ in enumerate(small_shares(16)):
        current = reserve_pod(
            current, pod_, make_policy(policy), AllocationId(f"a-{n}"), now=0, lease_s=9, slots_per_card=8
        )
    per_card = Counter(card_of(i) for a in current.allocations for g in a.grants for i in g.device_ids)
    assert sorted(per_card.values()) == [8, 8]
    with pytest.raises(Exhausted, match="slots used up: 2 card\\(s\\) have every kubelet slot held"):
        plan(current, small_shares(1)[0], make_policy(policy), slots_per_card=8)
    assert plan(current, small_shares(1)[0], make_policy(policy), slots_per_card=None)  # not counted: fits


@pytest.mark.parametrize(
    ("containers", "slots", "fits"),
    [
        ((Request(1, mem_mib=10), Request(1, mem_mib=10)), 1, False),  # two app containers need two slots
        ((Request(1, mem_mib=10), Request(1, mem_mib=10)), 2, True),
        ((Request(1),), 1, True),
    ],
)
def test_each_app_container_of_a_pod_takes_a_slot(containers: tuple[Request, ...], slots: int, fits: bool) -> None:
    pod_ = pod(*(ContainerAsk(f"c{n}", r) for n, r in enumerate(containers)))
    try:
        plan(ledger(8000), pod_, POLICY, slots_per_card=slots)
    except Exhausted as err:
        assert not fits and "slots used up" in str(err)
    else:
        assert fits


@pytest.mark.parametrize(
    ("wanted", "expanded"),
    [
        ({"A100"}, {"NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB"}),
        ({"h100"}, {"NVIDIA H100 80GB HBM3"}),
        ({"A10"}, {"A10"}),  # a word, not a prefix: A100 is not an A10
        ({"V100", "H100"}, {"Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3"}),
        ({"Tesla V100-SXM2-32GB"}, {"Tesla V100-SXM2-32GB"}),
    ],
)
def test_model_selectors_match_whole_words(wanted: set[str], expanded: set[str]) -> None:
    known = ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB"]
    assert expand_models(frozenset(wanted), known) == expanded


@pytest.mark.parametrize(
    ("ask", "reason"),
    [
        (Ask(Request(3)), "has 2 card(s) that qualify, the pod needs 3"),
        (Ask(Request(1, mem_mib=9000)), "its largest card has 8000 MiB, the pod needs 9000 MiB on each of 1"),
        (Ask(Request(1, models=frozenset({"other"}))), "no card of model other"),
        (Ask(Request(2, mem_mib=8000)), ""),
        (Ask(None), ""),
    ],
)
def test_what_never_fits(ask: Ask, reason: str) -> None:
    found = impossible(from_ledger(ledger(8000, 8000)), ask)
    assert found.startswith(reason) if reason else found == ""


def test_a_card_of_unknown_size_never_holds_a_memory_share() -> None:
    unknown = from_ledger(ledger(0))  # the inventory could not read the card's memory size
    assert impossible(unknown, Ask(Request(1, mem_mib=500))) == (
        "its largest card has 0 MiB, the pod needs 500 MiB on each of 1"
    )
    assert impossible(unknown, Ask(Request(1, core_milli=100))) == ""
    assert impossible(unknown, Ask(Request(1))) == ""


def test_a_pod_without_card_containers() -> None:
    empty = PodAsk(OWNER)
    assert not empty.wants_cards and empty.single() is None and empty.main() is None
    assert plan(NodeLedger(ledger(8000).node), empty, POLICY, slots_per_card=8) == ()


def test_a_hint_is_taken_while_it_fits_and_a_stale_or_foreign_one_is_not() -> None:
    one = pod(ContainerAsk("c", Request(1, mem_mib=1000)))
    empty = ledger(8000, 8000, 8000)

    def cards(state: NodeLedger, hint: tuple[tuple[int, ...], ...] | None, ask: PodAsk = one) -> list[int]:
        after = reserve_pod(state, ask, POLICY, AllocationId("a"), now=0, lease_s=9, slots_per_card=8, hint=hint)
        found = after.get(AllocationId("a"))
        assert found is not None
        assert [card_of(i) for i in found.grants[0].device_ids] == [s.uuid for s in found.shares()]
        return [s.index for s in found.shares()]

    assert cards(empty, None) == [0]
    assert cards(empty, ((2,),)) == [2]
    whole = pod(ContainerAsk("w", Request(1)))
    full = reserve_pod(empty, whole, POLICY, AllocationId("w"), now=0, lease_s=9, slots_per_card=8, hint=((2,),))
    assert cards(full, ((2,),)) == [0]  # card 2 is taken now: chosen again
    for foreign in (((0, 1),), ((7,),), ((0,), (1,))):  # another count, no such card, another pod's shape
        assert cards(empty, foreign) == [0]
    hinted = reserve_pod(empty, one, POLICY, AllocationId("a"), now=0, lease_s=9, slots_per_card=8, hint=((1,),))
    assert [s.mem_mib for s in hinted.allocations[0].shares()] == [1000]  # the share is the request's
