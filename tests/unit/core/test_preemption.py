"""Share-aware preemption on one node and across nodes: the smallest set of lower-priority holders
on the right cards, never one that would not help, the cheapest node by kube-scheduler's order."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.claim_asks import ClaimAsk, RequestAsk
from gpuledger_core.claim_placement import claim_as_pod, claim_as_pods
from gpuledger_core.claims import ClaimRef
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, release, reserve
from gpuledger_core.model import Allocation, AllocState, Grant, Link, MigSlot, Node, Owner, OwnerKind, Request
from gpuledger_core.nvlink import Linked
from gpuledger_core.packing import make_policy
from gpuledger_core.pods import PodAsk
from gpuledger_core.preemption import (
    PREEMPTED_BY,
    Fit,
    Holder,
    HostFree,
    choose,
    on_node,
    preempted,
    room_held,
)

from .builders import NODE, allocation, card, holding, share, whole
from .test_mig_ledger import A100, instance_share, mig_card

FIT = Fit(make_policy("bestfit"), slots_per_card=8)
PREEMPTOR = Owner(OwnerKind.POD, "uid-high", "ns", "high")
GIB = 1024


def pod(mem_mib: int | None = None, count: int = 1, cpu_milli: int = 0, memory_mib: int = 0) -> PodAsk:
    return PodAsk(PREEMPTOR, (ContainerAsk("main", Request(count, mem_mib=mem_mib)),), cpu_milli=cpu_milli,
                  memory_mib=memory_mib)  # fmt: skip


def shares_on(node: Node, *held: tuple[str, int, int]) -> NodeLedger:
    """``node`` with one holder per (id, card, MiB)."""
    allocations = tuple(
        allocation(name, Grant("main", (share(index, mem, 100),)), name=node.name) for name, index, mem in held
    )
    return NodeLedger(node, allocations)


def two_cards(name: str = "node-a") -> Node:
    return Node(NodeName(name), (card(0, 8 * GIB), card(1, 8 * GIB)))


def low(*names: str, priority: int = 0, **started: float) -> dict[str, Holder]:
    return {f"pod:uid-{n}": Holder(priority, started_at=started.get(n, 0.0)) for n in names}


def test_the_victims_are_the_fewest_on_one_card_never_spread_over_both() -> None:
    # card 0 is full with 4 + 4 GiB, card 1 has 1 GiB free beside 2 + 2 + 3 GiB. 5 GiB takes two
    # victims either way: both of card 0's, or card 1's 3 GiB and one of its 2 GiB; one from each
    # card would free room on neither.
    ledger = shares_on(two_cards(), ("a", 0, 4 * GIB), ("b", 0, 4 * GIB), ("c", 1, 2 * GIB), ("d", 1, 2 * GIB),
                       ("e", 1, 3 * GIB))  # fmt: skip
    holders = low("a", "b", "c", "d", "e")
    found = on_node(ledger, pod(5 * GIB), 100, holders, FIT, now=10.0)
    assert found is not None
    evicted = {a.id for a in found.evict}
    assert len(evicted) == 2
    assert evicted in ({"a", "b"}, {"c", "e"}, {"d", "e"})
    cards = {a.shares()[0].index for a in found.evict}
    assert len(cards) == 1 and found.grants[0].cards[0].index in cards


def test_lower_priority_and_younger_victims_go_first() -> None:
    ledger = shares_on(two_cards(), ("a", 0, 6 * GIB), ("b", 1, 6 * GIB))
    holders = {"pod:uid-a": Holder(5), "pod:uid-b": Holder(1)}
    found = on_node(ledger, pod(4 * GIB), 100, holders, FIT, now=10.0)
    assert found is not None and [a.id for a in found.evict] == ["b"]
    same = low("a", "b", a=1.0, b=8.0)  # b started later: less work lost
    found = on_node(ledger, pod(4 * GIB), 100, same, FIT, now=10.0)
    assert found is not None and [a.id for a in found.evict] == ["b"]


def test_a_budget_protected_holder_goes_only_when_nothing_else_helps() -> None:
    ledger = shares_on(two_cards(), ("a", 0, 6 * GIB), ("b", 1, 6 * GIB))
    holders = {"pod:uid-a": Holder(0, protected=True), "pod:uid-b": Holder(5)}
    found = on_node(ledger, pod(4 * GIB), 100, holders, FIT, now=10.0)
    assert found is not None and [a.id for a in found.evict] == ["b"]
    found = on_node(shares_on(two_cards(), ("a", 0, 6 * GIB)), pod(7 * GIB, count=2), 100, holders, FIT, now=10.0)
    assert found is not None and [a.id for a in found.evict] == ["a"] and found.cost[0] == 1


def test_equal_or_higher_priority_and_unknown_holders_never_go() -> None:
    ledger = shares_on(two_cards(), ("a", 0, 6 * GIB), ("b", 1, 6 * GIB))
    assert on_node(ledger, pod(4 * GIB), 100, {"pod:uid-a": Holder(100), "pod:uid-b": Holder(200)}, FIT, 1.0) is None
    assert on_node(ledger, pod(4 * GIB), 100, {}, FIT, 1.0) is None  # a tool, or a pod of unknown priority


def test_a_pod_that_fits_already_evicts_nobody_and_one_that_never_fits_gets_none() -> None:
    ledger = shares_on(two_cards(), ("a", 0, 6 * GIB))
    found = on_node(ledger, pod(4 * GIB), 100, low("a"), FIT, 1.0)
    assert found is not None and found.evict == () and found.grants[0].cards[0].index == 1
    assert on_node(ledger, pod(9 * GIB), 100, low("a"), FIT, 1.0) is None  # no card has 9 GiB


def test_a_multi_card_pod_frees_the_cheapest_cards() -> None:
    node = Node(NodeName("node-a"), tuple(card(i, 8 * GIB) for i in range(4)))
    ledger = shares_on(node, ("a", 0, 2 * GIB), ("b", 1, 2 * GIB), ("c", 1, 2 * GIB), ("d", 2, 2 * GIB),
                       ("e", 3, 2 * GIB), ("f", 3, 2 * GIB), ("g", 3, 2 * GIB))  # fmt: skip
    found = on_node(ledger, pod(None, count=2), 100, low(*"abcdefg"), FIT, 1.0)  # two whole cards
    assert found is not None and {a.id for a in found.evict} == {"a", "d"}
    assert sorted(s.index for s in found.grants[0].cards) == [0, 2]


def test_the_node_whose_victims_cost_least_is_chosen() -> None:
    dear = shares_on(two_cards("node-a"), ("a", 0, 8 * GIB), ("b", 1, 8 * GIB))
    cheap = shares_on(two_cards("node-b"), ("c", 0, 8 * GIB), ("d", 1, 8 * GIB))
    holders = {"pod:uid-a": Holder(50), "pod:uid-b": Holder(50), "pod:uid-c": Holder(10), "pod:uid-d": Holder(60)}
    found = choose([dear, cheap], pod(4 * GIB), 100, holders, FIT, 1.0)
    assert found is not None and found.node == "node-b" and [a.id for a in found.evict] == ["c"]


def hungry(cpu: dict[str, int], priority: int = 0) -> dict[str, Holder]:
    """Holders of ``priority`` each asking the host for its CPU (millicores) and 1 GiB."""
    return {f"pod:uid-{n}": Holder(priority, cpu_milli=c, memory_mib=GIB) for n, c in cpu.items()}


def test_the_host_s_cpu_and_memory_count_in_the_choice_of_node() -> None:
    # node-a: one 6 GiB share frees card 0, but its host has 1 CPU free and the pod asks 8: the
    # two holders of card 1 must go too (3 victims). node-b: one 6 GiB share whose 8 CPU free
    # both the card and the host. Blind to hosts, node-a's single card victim wins the tie.
    a = shares_on(two_cards("node-a"), ("a", 0, 6 * GIB), ("x", 1, 3 * GIB), ("y", 1, 3 * GIB))
    b = shares_on(two_cards("node-b"), ("b", 0, 6 * GIB), ("z", 1, 6 * GIB))
    holders = hungry({"a": 1000, "x": 3000, "y": 4000, "b": 8000, "z": 500})
    asked = pod(6 * GIB, cpu_milli=8000, memory_mib=GIB)
    blind = choose([a, b], asked, 100, holders, FIT, 1.0)
    assert blind is not None and blind.node == "node-a" and [v.id for v in blind.evict] == ["a"]
    hosts = {NodeName("node-a"): HostFree(1000, 64 * GIB), NodeName("node-b"): HostFree(0, 64 * GIB)}
    found = choose([a, b], asked, 100, holders, FIT, 1.0, hosts)
    assert found is not None and found.node == "node-b" and [v.id for v in found.evict] == ["b"]
    assert found.cost[2] == 1


def test_the_host_s_further_victims_are_the_fewest_that_free_enough_and_only_of_lower_priority() -> None:
    # The pod fits card 1 already; its host lacks 4 CPU. Of the others, h (6 CPU) alone frees
    # enough; s (500m) would not help and stays, as do the peer of equal priority and its 9 CPU.
    ledger = shares_on(two_cards(), ("s", 0, 2 * GIB), ("h", 0, 2 * GIB), ("peer", 0, 2 * GIB))
    holders = {**hungry({"s": 500, "h": 6000}), "pod:uid-peer": Holder(100, cpu_milli=9000)}
    host = HostFree(2000, 64 * GIB)
    found = on_node(ledger, pod(4 * GIB, cpu_milli=6000), 100, holders, FIT, 1.0, host)
    assert found is not None and [v.id for v in found.evict] == ["h"]
    assert found.grants[0].cards[0].index == 1
    # Memory counts as CPU does, and a host that no set of lower-priority holders frees is no choice.
    assert on_node(ledger, pod(4 * GIB, memory_mib=70 * GIB), 100, holders, FIT, 1.0, host) is None
    assert on_node(ledger, pod(4 * GIB, cpu_milli=9000), 100, holders, FIT, 1.0, host) is None
    roomy = HostFree(6000, 64 * GIB)
    found = on_node(ledger, pod(4 * GIB, cpu_milli=6000), 100, holders, FIT, 1.0, roomy)
    assert found is not None and found.evict == ()  # the host takes it: nobody goes


def test_a_card_victim_that_frees_the_host_too_is_preferred_to_one_that_needs_a_second() -> None:
    # Any card's one victim frees the 6 GiB the pod needs; the host lacks 3 CPU. Card 1's victim
    # frees 4 CPU; card 0's only 1, and a second holder would have to go: card 1 is the choice
    # (blind to the host, the first card's would be).
    node = Node(NodeName("node-a"), (card(0, 8 * GIB), card(1, 8 * GIB), card(2, 8 * GIB)))
    ledger = shares_on(node, ("small", 0, 6 * GIB), ("big", 1, 6 * GIB), ("other", 2, 6 * GIB))
    holders = hungry({"big": 4000, "small": 1000, "other": 3000})
    blind = on_node(ledger, pod(6 * GIB, cpu_milli=3000), 100, holders, FIT, 1.0)
    assert blind is not None and [v.id for v in blind.evict] == ["small"]
    found = on_node(ledger, pod(6 * GIB, cpu_milli=3000), 100, holders, FIT, 1.0, HostFree(0, 64 * GIB))
    assert found is not None and [v.id for v in found.evict] == ["big"]


@st.composite
def crowded(draw: st.DrawFn) -> tuple[NodeLedger, dict[str, Holder], int]:
    cards = draw(st.integers(1, 4))
    node = Node(NodeName("node-a"), tuple(card(i, 8 * GIB) for i in range(cards)))
    held: list[Allocation] = []
    use = [0] * cards
    for i in range(draw(st.integers(0, 12))):
        index, mem = draw(st.integers(0, cards - 1)), draw(st.sampled_from([GIB, 2 * GIB, 3 * GIB, 4 * GIB]))
        if use[index] + mem <= 8 * GIB:
            use[index] += mem
            held.append(allocation(f"h{i}", Grant("main", (share(index, mem, 100),))))
    holders = {a.owner.key: Holder(draw(st.integers(0, 3)), started_at=float(draw(st.integers(0, 9)))) for a in held}
    return NodeLedger(node, tuple(held)), holders, draw(st.sampled_from([GIB, 3 * GIB, 5 * GIB, 8 * GIB]))


@settings(max_examples=150, deadline=None)
@given(crowded(), st.integers(1, 4))
def test_no_victim_could_be_spared_and_the_pod_fits_once_they_go(case: tuple[NodeLedger, dict[str, Holder], int],
                                                                  priority: int) -> None:  # fmt: skip
    ledger, holders, mem = case
    asked = pod(mem)
    found = on_node(ledger, asked, priority, holders, FIT, now=10.0)
    everyone = [a for a in ledger.live() if holders[a.owner.key].priority < priority]
    if found is None:
        assert FIT.grants(ledger, asked, (a.id for a in everyone)) is None  # nothing would have helped
        return
    gone = [a.id for a in found.evict]
    assert all(holders[a.owner.key].priority < priority for a in found.evict)
    assert FIT.grants(ledger, asked, gone) is not None
    for spared in gone:
        assert FIT.grants(ledger, asked, [g for g in gone if g != spared]) is None, f"{spared} need not go"
    cards = {s.index for a in found.evict for s in a.shares()}
    assert len(cards) <= 1  # a one-card pod's victims sit on one card


def test_a_card_held_by_a_holder_that_may_not_go_is_not_counted_as_free_for_a_multi_card_pod() -> None:
    # Card 0 is held whole by a pod of the preemptor's priority; cards 1 and 2 by one low holder
    # each (a and b, the oldest), card 3 by two (c and d). Two whole cards: a and b, not b, c, d.
    node = Node(NodeName("node-a"), tuple(card(i, 8 * GIB) for i in range(4)))
    held = [("peer", 0), ("a", 1), ("b", 2)]
    allocations = [allocation(n, Grant("main", (whole(node.cards[i]),)), name=node.name) for n, i in held]
    allocations += [allocation(n, Grant("main", (share(3, 2 * GIB, 100),)), name=node.name) for n in ("c", "d")]
    holders = {**low("a", "b", "c", "d", a=1.0, b=2.0, c=5.0, d=6.0), "pod:uid-peer": Holder(100)}
    found = on_node(NodeLedger(node, tuple(allocations)), pod(None, count=2), 100, holders, FIT, now=10.0)
    assert found is not None and {a.id for a in found.evict} == {"a", "b"}


def test_an_entry_preemption_released_and_a_room_it_holds_are_told_apart_from_others() -> None:
    ledger = shares_on(two_cards(), ("a", 0, 4 * GIB), ("b", 1, 2 * GIB))
    taken = release(ledger, AllocationId("a"), 5.0, f"{PREEMPTED_BY}pod ns/high")
    gone = release(ledger, AllocationId("b"), 5.0, "the pod was deleted")
    assert preempted(taken.get(AllocationId("a"))) and not preempted(gone.get(AllocationId("b")))
    assert not preempted(ledger.get(AllocationId("a")))  # live
    assert not preempted(None)
    held = replace(ledger.allocations[0], state=AllocState.RESERVED, lease_expires_at=130.0)
    assert room_held(held) and not room_held(ledger.allocations[1]) and not room_held(None)
    assert not room_held(replace(held, state=AllocState.RELEASED))


def test_a_claim_is_preempted_for_as_a_pod_of_its_requests_first_choices() -> None:
    claim = Owner(OwnerKind.CLAIM, "uid-claim", "ns", "big")
    first, second = Request(1, mem_mib=10 * GIB), Request(1, mem_mib=5 * GIB)
    ask = ClaimAsk(ClaimRef("ns", "big", "uid-claim"), (RequestAsk("gpu", (("gpu/a", first), ("gpu/b", second))),))
    as_pod = claim_as_pod(ask, cpu_milli=500, memory_mib=256)
    assert as_pod.owner == claim
    assert [(c.container, c.request) for c in as_pod.containers] == [("gpu", first)]
    assert (as_pod.cpu_milli, as_pod.memory_mib) == (500, 256)


def test_a_claim_whose_cards_must_share_an_nvlink_group_gets_victims_that_free_linked_cards() -> None:
    # four cards linked in pairs 0-1 and 2-3; cards 1 and 2 held by low-priority pods. Two whole
    # cards fit on 0 and 3 with nobody evicted, but they are not linked: a claim whose request
    # must share an NVLink group evicts one holder, and gets a linked pair.
    links = (Link(0, 1, nvlinks=4), Link(2, 3, nvlinks=4))
    node = Node(NodeName("node-a"), tuple(card(i, 8 * GIB) for i in range(4)), links)
    ledger = shares_on(node, ("x", 1, 2 * GIB), ("y", 2, 2 * GIB))
    two = RequestAsk("gpu", (("gpu", Request(2)),))
    apart = claim_as_pods(ClaimAsk(ClaimRef("ns", "pair", "uid-pair"), (two,)))[0]
    linked = claim_as_pods(ClaimAsk(ClaimRef("ns", "pair", "uid-pair"), (two,), linked=(Linked(2, ("gpu",)),)))[0]
    assert linked.linked == (Linked(2, ("gpu",)),)

    free = on_node(ledger, apart, 100, low("x", "y"), FIT, 1.0)
    assert free is not None and free.evict == ()  # cards 0 and 3, nobody evicted
    found = on_node(ledger, linked, 100, low("x", "y"), FIT, 1.0)
    assert found is not None and len(found.evict) == 1
    cards = sorted(s.index for s in found.grants[0].cards)
    assert cards in ([0, 1], [2, 3]) and found.evict[0].shares()[0].index in cards
    assert on_node(ledger, linked, 100, {}, FIT, 1.0) is None  # nobody may go: no linked pair


# --- MIG: instances are held whole; a placement frees only when every holder overlapping it goes ---


def _mig_node() -> tuple[NodeLedger, dict[str, Holder]]:
    """Two A100 40 GB cards in MIG mode and a whole-mode card: card 0 holds a 3g.20gb at 4 (a), a
    2g.10gb at 0 (b) and a 1g.5gb at 2 (c); card 1 a 7g.40gb (d, above the preemptor); card 2,
    whole mode, one whole-card holder (e)."""
    zero, one = mig_card(0), mig_card(1)
    plain = card(2, 40960, model=A100)
    ledger = NodeLedger(Node(NODE, (zero, one, plain)))
    for held in (
        holding("a", instance_share(zero, "3g.20gb", 4)),
        holding("b", instance_share(zero, "2g.10gb", 0)),
        holding("c", instance_share(zero, "1g.5gb", 2)),
        holding("d", instance_share(one, "7g.40gb", 0)),
        holding("e", whole(plain)),
    ):
        ledger = reserve(ledger, held)
    holders = low("a", "b", "c", "e") | {"pod:uid-d": Holder(200)}
    return ledger, holders


def mig_pod(profile: str) -> PodAsk:
    return PodAsk(PREEMPTOR, (ContainerAsk("main", Request(1, mig=profile)),))


def test_a_mig_ask_evicts_only_the_holder_of_the_placement_it_takes() -> None:
    ledger, holders = _mig_node()
    found = on_node(ledger, mig_pod("3g.20gb"), 100, holders, FIT, now=10.0)
    assert found is not None and [a.id for a in found.evict] == ["a"]
    (taken,) = found.grants[0].cards
    assert (taken.index, taken.mig) == (0, MigSlot("3g.20gb", 4, 4))


def test_a_whole_card_profile_evicts_every_holder_of_one_card_and_nothing_elsewhere() -> None:
    ledger, holders = _mig_node()
    found = on_node(ledger, mig_pod("7g.40gb"), 100, holders, FIT, now=10.0)
    assert found is not None and {a.id for a in found.evict} == {"a", "b", "c"}  # d outranks the pod
    lower = holders | {"pod:uid-d": Holder(0, started_at=9.0)}
    found = on_node(ledger, mig_pod("7g.40gb"), 100, lower, FIT, now=10.0)
    assert found is not None and [a.id for a in found.evict] == ["d"]  # one victim beats three


def test_mig_holders_never_go_for_a_share_and_shares_never_for_a_mig_ask() -> None:
    ledger, holders = _mig_node()
    found = on_node(ledger, pod(20 * GIB), 100, holders, FIT, now=10.0)
    assert found is not None and [a.id for a in found.evict] == ["e"]  # the only card a share may take
    only_e = {"pod:uid-e": holders["pod:uid-e"]}
    assert on_node(ledger, mig_pod("3g.20gb"), 100, only_e, FIT, now=10.0) is None
