"""Identifying the container kubelet admits from device IDs alone (gpuledger_plugin.matching)."""

from __future__ import annotations

from gpuledger_core.ids import AllocationId
from gpuledger_core.model import Grant
from gpuledger_core.slots import node_slots
from gpuledger_plugin.matching import Ambiguous, Found, Refused, pending, resolve, steer
from gpuledger_plugin.transitions import bind

from .plugin_fixtures import SLOTS, ids_of, ledger_with, node, pod, share

ALL = node_slots(node(), SLOTS)


def test_steer_points_kubelet_at_the_only_reservation_of_that_size() -> None:
    ledger = ledger_with(
        pod("a", Grant("c", (share(1),))), pod("b", Grant("c", (share(2), share(3))))
    )
    got = steer(ledger, {}, ALL, (), 2)
    assert isinstance(got, Found)
    assert got.ids == ids_of(ledger, "b")


def test_same_size_different_limits_is_ambiguous_until_kubelet_says_which_pod() -> None:
    ledger = ledger_with(
        pod("a", Grant("c", (share(0, mem=2048),))), pod("b", Grant("c", (share(1, mem=8192),)))
    )
    assert isinstance(steer(ledger, {}, ALL, (), 1), Ambiguous)
    got = steer(ledger, {}, ALL, (), 1, admitting={("ns", "b"), ("ns", "other")})
    assert isinstance(got, Found)
    assert got.slot.allocation.owner.name == "b"
    assert got.ids == ids_of(ledger, "b")


def test_interchangeable_reservations_are_picked_oldest_first_without_asking() -> None:
    ledger = ledger_with(
        pod("young", Grant("c", (share(1),)), created=2.0),
        pod("old", Grant("c", (share(0),)), created=1.0),
    )
    got = steer(ledger, {}, ALL, (), 1)
    assert isinstance(got, Found)
    assert got.guessed
    assert got.slot.allocation.owner.name == "old"


def test_different_models_are_not_interchangeable() -> None:
    n = node(models=("H100", "A100", "H100", "A100"))
    ledger = ledger_with(pod("a", Grant("c", (share(0),))), pod("b", Grant("c", (share(1),))), n=n)
    assert isinstance(steer(ledger, {}, node_slots(n, SLOTS), (), 1), Ambiguous)


def test_containers_of_one_pod_are_admitted_in_kubelet_order() -> None:
    ledger = ledger_with(
        pod(
            "p",
            Grant("init", (share(0, mem=4096),), init=True),
            Grant("x", (share(1),)),
            Grant("y", (share(2, mem=512),)),
        )
    )
    first = steer(ledger, {}, ALL, (), 1)
    assert isinstance(first, Found)
    assert first.slot.grant.container == "init"
    second = steer(ledger, {first.slot.allocation.id: {0}}, ALL, (), 1)
    assert isinstance(second, Found)
    assert second.slot.grant.container == "x"


def test_must_include_names_the_pod() -> None:
    ledger = ledger_with(
        pod(
            "p", Grant("init", (share(0), share(1)), init=True), Grant("app", (share(0), share(1)))
        ),
        pod("q", Grant("c", (share(2), share(3)))),
    )
    reused = ids_of(ledger, "p", 0)[:1]
    got = steer(ledger, {AllocationId("a-p"): {0}}, ALL, reused, 2)
    assert isinstance(got, Found)
    assert got.slot.grant.container == "app"
    assert reused[0] in got.ids


def test_resolve_exact_ids_find_their_container() -> None:
    ledger = ledger_with(
        pod("a", Grant("c", (share(0, mem=2048),))), pod("b", Grant("c", (share(1, mem=8192),)))
    )
    got = resolve(ledger, {}, ids_of(ledger, "b"), steered=None, admitting={("ns", "b")})
    assert isinstance(got, Found)
    assert got.slot.allocation.owner.name == "b"
    assert not got.rehome


def test_resolve_refuses_another_pods_ids_when_kubelet_says_who_is_admitted() -> None:
    ledger = ledger_with(
        pod("a", Grant("c", (share(0, mem=2048),))), pod("b", Grant("c", (share(1, mem=8192),)))
    )
    unsure = resolve(ledger, {}, ids_of(ledger, "b"))
    assert isinstance(unsure, Ambiguous)
    got = resolve(ledger, {}, ids_of(ledger, "b"), admitting={("ns", "a")})
    assert isinstance(got, Refused)
    assert "refusing rather than swapping" in got.reason


def test_resolve_rehomes_free_ids_onto_the_only_reservation_of_that_size() -> None:
    ledger = ledger_with(
        pod("a", Grant("c", (share(0),))), pod("b", Grant("c", (share(1), share(2))))
    )
    got = resolve(ledger, {}, ["GPU-3::2"])
    assert isinstance(got, Found)
    assert got.rehome
    assert got.slot.allocation.owner.name == "a"


def test_free_slot_of_a_card_a_look_alike_pending_pod_reserved_trades_the_reservations() -> None:
    """kubelet gives the oldest pending pod's container a free slot of the card a younger pod
    reserved whole; both are still to admit and look alike: they trade reservations, and the
    container moves onto the slot kubelet chose, rather than being refused for a card held."""
    ledger = ledger_with(
        pod("old", Grant("c", (share(0, exclusive=True),)), created=1.0),
        pod("young", Grant("c", (share(1, exclusive=True),)), created=2.0),
    )
    got = resolve(ledger, {}, ["GPU-1::2"])
    assert isinstance(got, Found)
    assert got.slot.allocation.owner.name == "old"
    assert got.trade is not None and got.trade.allocation.owner.name == "young"
    trade = ((got.trade.allocation.id, got.trade.index), got.trade.ids)
    bound = bind(ledger, (got.slot.allocation.id, got.slot.index), got.slot.ids, got.ids, 5.0, trade)
    assert ids_of(bound, "old") == ("GPU-1::2",)
    assert ids_of(bound, "young") == ids_of(ledger, "old")


def test_a_card_reserved_by_a_pod_of_another_shape_is_not_traded() -> None:
    ledger = ledger_with(
        pod("a", Grant("c", (share(0, exclusive=True),))),
        pod("b", Grant("c", (share(1, mem=2048),))),
    )
    got = resolve(ledger, {}, ["GPU-1::2"], admitting={("ns", "a")})
    assert isinstance(got, Found)
    assert got.slot.allocation.owner.name == "a"
    assert got.trade is None  # binding it fails: the card is not free for a whole-card grant


def test_resolve_refuses_ids_spanning_two_pods() -> None:
    ledger = ledger_with(pod("a", Grant("c", (share(0),))), pod("b", Grant("c", (share(1),))))
    got = resolve(ledger, {}, [*ids_of(ledger, "a"), *ids_of(ledger, "b")])
    assert isinstance(got, Refused)
    assert "different pods" in got.reason


def test_resolve_refuses_when_nothing_is_reserved() -> None:
    got = resolve(ledger_with(), {}, ["GPU-0::0"])
    assert isinstance(got, Refused)
    assert "no container" in got.reason


def test_init_reuse_resolves_to_the_next_container_of_the_same_pod() -> None:
    ledger = ledger_with(pod("p", Grant("init", (share(0),), init=True), Grant("app", (share(0),))))
    assert ids_of(ledger, "p", 0) == ids_of(ledger, "p", 1)
    first = resolve(ledger, {}, ids_of(ledger, "p", 0))
    assert isinstance(first, Found)
    assert first.slot.grant.container == "init"
    second = resolve(ledger, {AllocationId("a-p"): {0}}, ids_of(ledger, "p", 0))
    assert isinstance(second, Found)
    assert second.slot.grant.container == "app"


def test_answered_pods_are_not_pending() -> None:
    ledger = ledger_with(pod("a", Grant("c", (share(0),))))
    assert pending(ledger, {AllocationId("a-a"): {0}}) == ()
