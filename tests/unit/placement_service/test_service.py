"""Placement's decisions over an in-memory view: filter reasons, scores, place, preferred."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger_core.errors import Exhausted, FailedPrecondition, NotFound, Unavailable
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import release
from gpuledger_core.model import Owner, OwnerKind, Request
from gpuledger_core.pods import PodAsk, reserve_pod
from gpuledger_core.slots import device_id

from .fleet import parts

NODES = ("rtx-0", "p4-0", "h100-0", "a100-0")
OWNER = Owner(OwnerKind.POD, "uid-1", "ns", "p")


def pod(*requests: Request, init: tuple[Request, ...] = (), policy: str = "") -> PodAsk:
    containers = [ContainerAsk(f"i{n}", r, init=True) for n, r in enumerate(init)]
    containers += [ContainerAsk(f"c{n}", r) for n, r in enumerate(requests)]
    return PodAsk(OWNER, tuple(containers), policy=policy)


def test_filter_separates_what_waiting_fixes_from_what_it_cannot() -> None:
    built = parts()
    # Fill rtx-0's only card.
    entry = built.view.entry("rtx-0")
    assert entry is not None
    _, policy = built.service.policies.get("default")
    full = reserve_pod(entry.ledger, pod(Request(1)), policy, AllocationId("a-1"), now=0, lease_s=60, slots_per_card=8)
    built.view.apply(NodeName("rtx-0"), full, entry.revision + 1)

    found = built.service.filter(pod(Request(1, mem_mib=20000, models=frozenset({"RTX", "H100"}))), [*NODES, "gone"])
    assert found.fits == ("h100-0",)
    assert found.failed["gone"] == "not in the gpuledger ledger: no inventory from this node yet"
    assert found.failed["rtx-0"] == "card 0 has 0 MiB free, 20000 MiB short of 20000 MiB"
    assert "no card of model" in found.unresolvable["a100-0"]
    assert "no card of model" in found.unresolvable["p4-0"]


@pytest.mark.parametrize(
    ("request_", "node", "reason"),
    [
        (Request(2), "rtx-0", "has 1 card(s) that qualify, the pod needs 2"),
        (Request(1, mem_mib=9000), "p4-0", "its largest card has 7611 MiB, the pod needs 9000 MiB on each of 1"),
        (
            Request(1, models=frozenset({"A100"})),
            "h100-0",
            "no card of model NVIDIA A100-PCIE-40GB (has NVIDIA H100 80GB HBM3)",
        ),
    ],
)
def test_unresolvable_reasons(request_: Request, node: str, reason: str) -> None:
    found = parts().service.filter(pod(request_), [node])
    assert found.unresolvable == {node: reason}


def test_a_stale_node_fails_but_may_come_back() -> None:
    built = parts(stale_after_s=5.0)
    built.view.clock = lambda: 1000.0
    built.view.started_at = 900.0  # no word from a100-0 since then
    built.view.heartbeat("h100-0", 999.0)
    found = built.service.filter(pod(Request(1)), ["h100-0", "a100-0"])
    assert found.fits == ("h100-0",)
    assert "stale" in found.failed["a100-0"]


def test_a_stale_node_gets_no_pod_that_takes_no_card_either_and_says_why_as_for_one_that_does() -> None:
    built = parts(stale_after_s=5.0)
    built.view.clock = lambda: 1000.0
    built.view.started_at = 900.0  # no word from a100-0 since then
    built.view.heartbeat("h100-0", 999.0)
    cpu_only = PodAsk(OWNER, (), cpu_milli=1000, memory_mib=1024)
    found = built.service.filter(cpu_only, ["h100-0", "a100-0", "cpu-0"])
    assert found.fits == ("h100-0", "cpu-0")  # cpu-0 has no cards, so no inventory to go stale
    assert found.failed == {"a100-0": built.service.filter(pod(Request(1)), ["a100-0"]).failed["a100-0"]}
    assert "stale" in found.failed["a100-0"]
    built.view.heartbeat("a100-0", 999.5)  # it reports again
    assert built.service.filter(cpu_only, ["a100-0"]).fits == ("a100-0",)


def test_answers_are_recomputed_when_the_node_changes() -> None:
    built = parts()
    ask = pod(Request(2))
    assert built.service.filter(ask, ["p4-0"]).fits == ("p4-0",)
    entry = built.view.entry("p4-0")
    assert entry is not None
    _, policy = built.service.policies.get("default")
    other = replace(ask, owner=Owner(OwnerKind.POD, "uid-2"))
    taken = reserve_pod(entry.ledger, other, policy, AllocationId("a-2"), now=0, lease_s=60, slots_per_card=8)
    built.view.apply(NodeName("p4-0"), taken, entry.revision + 1)
    assert built.service.filter(ask, ["p4-0"]).failed == {"p4-0": "0 free whole card(s) of the 2 needed"}


def test_prioritize_scores_0_to_10_and_misfits_0() -> None:
    built = parts("binpack")
    scores = built.service.prioritize(pod(Request(1)), NODES)
    assert scores["rtx-0"] == 10 and scores["h100-0"] == 0
    assert set(scores) == set(NODES)
    assert built.service.prioritize(pod(Request(4)), NODES) == {"rtx-0": 0, "p4-0": 0, "h100-0": 0, "a100-0": 10}


def test_the_pod_policy_overrides_the_service_policy() -> None:
    built = parts("binpack")
    spread = built.service.prioritize(pod(Request(1), policy="spread"), NODES)
    assert spread["h100-0"] == 10 and spread["rtx-0"] == 0


def test_several_containers_must_fit_together() -> None:
    built = parts()
    two = pod(Request(1), Request(1))  # two app containers, a whole card each
    found = built.service.judge(two, NODES)
    assert "rtx-0" not in found.fits and {"p4-0", "h100-0", "a100-0"} <= set(found.fits)
    assert "rtx-0" in found.failed
    # An init container runs before the apps: it may use the same card.
    with_init = pod(Request(1), init=(Request(1),))
    assert "rtx-0" in built.service.judge(with_init, NODES).fits


def test_place_chooses_a_node_and_cards_and_ranks_the_rest() -> None:
    built = parts("binpack")
    placed = built.service.place(pod(Request(2)))
    assert placed.node == "p4-0"
    assert [[s.index for s in g.cards] for g in placed.grants] == [[0, 1]]
    assert placed.ranked == ("p4-0", "a100-0", "h100-0")
    assert built.service.place(pod(Request(2)), exclude={"p4-0"}).node == "a100-0"
    with pytest.raises(Exhausted, match="fits on no node"):
        built.service.place(pod(Request(9)))


def test_preferred_picks_distinct_cards_among_those_offered() -> None:
    built = parts()
    entry = built.view.entry("h100-0")
    assert entry is not None
    cards = entry.ledger.node.cards
    offered = [device_id(c.uuid, s) for c in cards[2:] for s in (3, 1)]
    ids = built.service.preferred("h100-0", offered, [], 2)
    assert ids == [device_id(cards[2].uuid, 1), device_id(cards[3].uuid, 1)]
    with pytest.raises(FailedPrecondition):
        built.service.preferred("h100-0", offered, [offered[0]], 2)
    assert built.service.preferred("h100-0", offered, [offered[0]], 1) == [offered[0]]
    with pytest.raises(NotFound):
        built.service.preferred("nowhere", offered, [], 1)


def test_an_unready_view_refuses_but_passes_pods_that_are_not_ours() -> None:
    built = parts()
    built.service.ready = lambda: "the ledger is unreachable"
    with pytest.raises(Unavailable, match="unreachable"):
        built.service.filter(pod(Request(1)), NODES)
    plain = PodAsk(OWNER)
    assert built.service.filter(plain, NODES).fits == NODES


def test_the_workload_is_seeded_from_the_live_allocations_in_the_ledger() -> None:
    built = parts()
    entry = built.view.entry("h100-0")
    assert entry is not None
    _, policy = built.service.policies.get("default")
    ledger, owners = entry.ledger, []
    for n, cards in enumerate((1, 2, 4)):
        owner = Owner(OwnerKind.POD, f"uid-s{n}", "ns", f"s{n}")
        ask = PodAsk(owner, (ContainerAsk("c", Request(cards)),))
        ledger = reserve_pod(ledger, ask, policy, AllocationId(f"a-s{n}"), now=n, lease_s=60, slots_per_card=8)
        owners.append(ask)
    ledger = release(ledger, AllocationId("a-s0"), now=5)  # released: not part of the workload
    generation = built.service.policies.generation

    assert built.service.policies.seed(ledger.allocations) == 2
    assert sorted(p.count for p in built.service.policies.tracker.seen()) == [2, 4]
    assert built.service.policies.generation == generation + 1  # the policies were rebuilt at once
    built.service.policies.observe(owners[2])  # the same pod asked about again: counted once
    assert len(built.service.policies.tracker.seen()) == 2


def small_share(n: int) -> PodAsk:
    owner = Owner(OwnerKind.POD, f"uid-small-{n}", "ns", f"small-{n}")
    return PodAsk(owner, (ContainerAsk("c", Request(1, mem_mib=100, core_milli=10)),))


def test_shares_spread_to_the_next_card_once_a_cards_slots_are_held_and_filter_says_so() -> None:
    built = parts()  # 8 slots per card (the default)
    entry = built.view.entry("p4-0")  # two cards
    assert entry is not None
    ledger, revision = entry.ledger, entry.revision
    for n in range(16):
        placed = built.service.place(small_share(n), exclude=set(NODES) - {"p4-0"})
        assert placed.node == "p4-0"
        _, policy = built.service.policies.get("default")
        ledger = reserve_pod(ledger, small_share(n), policy, AllocationId(f"a-{n}"), now=0, lease_s=9, slots_per_card=8)
        revision += 1
        built.view.apply(NodeName("p4-0"), ledger, revision)
    per_card = sorted(sum(1 for a in ledger.live() for s in a.shares() if s.index == i) for i in (0, 1))
    assert per_card == [8, 8]  # the ninth went to card 1, not refused on card 0
    found = built.service.judge(small_share(99), ["p4-0"])
    assert found.fits == ()
    assert found.failed["p4-0"].startswith("slots used up: 2 card(s) have every kubelet slot held")
    assert built.service.prioritize(small_share(99), ["p4-0", "h100-0"])["p4-0"] == 0


def test_default_weighs_the_card_models_against_the_fleets_cards_per_model() -> None:
    built = parts()
    supply = built.view.card_models()
    assert sum(supply.values()) == sum(len(e.ledger.node.cards) for e in built.view.entries.values())
    p4 = next(model for model in supply if "P4" in model)
    for n in range(20):  # the recent workload: pods that may only use P4 cards
        owner = Owner(OwnerKind.POD, f"uid-p4-{n}", "ns", f"p4-{n}")
        built.service.policies.observe(PodAsk(owner, (ContainerAsk("c", Request(1, models=frozenset({p4}))),)))
    built.service.policies.refresh()
    _, policy = built.service.policies.get("default")
    pressure = policy.scarcity.pressure  # type: ignore[attr-defined]
    assert set(pressure) == set(supply) and pressure[p4] > 0
    assert all(pressure[model] == 0 for model in supply if model != p4)
