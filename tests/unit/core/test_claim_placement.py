"""Where a claim goes (gpuledger_core.claim_placement): the classic policy's choice of node and
cards, firstAvailable in order, NVLink-linked requests, the host's say, and every node's reason
when none takes it."""

from __future__ import annotations

from random import Random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.claim_asks import ClaimAsk, RequestAsk
from gpuledger_core.claim_placement import place_claim
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import Exhausted
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, AllocState, CardShare, Grant, Link, Node, Owner, OwnerKind, Request
from gpuledger_core.nvlink import Linked
from gpuledger_core.packing import Ask, Decision, NodeState, from_ledger, make_policy, place
from tests.unit.core.builders import card

REF = ClaimRef("ns", "c", "uid-1")
ID = AllocationId("c-planned")


def node_of(name: str, *memories: int, links: tuple[Link, ...] = ()) -> Node:
    return Node(NodeName(name), tuple(card(i, m) for i, m in enumerate(memories)), links)


def held(ledger: NodeLedger, index: int, mem_mib: int, name: str = "other") -> NodeLedger:
    c = ledger.node.cards[index]
    owner = Owner(OwnerKind.POD, f"uid-{name}-{index}", "ns", name)
    allocation = Allocation(
        AllocationId(f"a-{name}-{ledger.node.name}-{index}"), owner, ledger.node.name,
        (Grant("main", (CardShare(c.uuid, index, mem_mib, 100),)),), AllocState.BOUND,
    )  # fmt: skip
    return reserve(ledger, allocation)


def one(request: Request, name: str = "gpu") -> ClaimAsk:
    return ClaimAsk(REF, (RequestAsk(name, ((name, request),)),))


def test_binpack_puts_a_share_beside_the_fullest_card_on_any_node() -> None:
    a = held(NodeLedger(node_of("a", 16000, 16000)), 1, 4000)
    b = held(NodeLedger(node_of("b", 16000, 16000)), 0, 10000)
    found = place_claim([a, b], one(Request(1, 4000, 250)), make_policy("binpack"), ID, 5.0, slots_per_card=8)
    allocation = found.allocation
    assert allocation.node == "b" and [s.index for s in allocation.shares()] == [0]
    assert allocation.owner == REF.owner and allocation.state is AllocState.BOUND and allocation.created_at == 5.0
    assert found.chosen == {"gpu": "gpu"}


def test_first_available_takes_the_first_subrequest_that_fits_anywhere() -> None:
    ask = ClaimAsk(REF, (RequestAsk("gpu", (("gpu/pair", Request(2)), ("gpu/one", Request(1)))),))
    found = place_claim([NodeLedger(node_of("a", 16000))], ask, make_policy("default"), ID, 0.0, slots_per_card=8)
    assert found.chosen == {"gpu": "gpu/one"} and len(found.allocation.shares()) == 1


def test_linked_requests_go_where_their_cards_are_connected_by_nvlink() -> None:
    linked = (Link(0, 1, 12),)
    plain, nvlinked = NodeLedger(node_of("a", 16000, 16000)), NodeLedger(node_of("b", 16000, 16000, links=linked))
    ask = ClaimAsk(REF, (RequestAsk("gpu", (("gpu", Request(2)),)),), linked=(Linked(2, ("gpu",)),))
    found = place_claim([plain, nvlinked], ask, make_policy("default"), ID, 0.0, slots_per_card=8)
    assert found.allocation.node == "b"
    with pytest.raises(Exhausted, match="a: cards 0, 1 for gpu are not in one NVLink group of 2"):
        place_claim([plain], ask, make_policy("default"), ID, 0.0, slots_per_card=8)


def test_two_linked_requests_get_a_free_nvlink_group_where_the_policys_first_plan_splits_them() -> None:
    """Cards 0-1 and 2-3 linked; card 1 half held. The policy gives request a card 0 and request b
    card 2 (not linked); the claim still gets the one free group, cards 2 and 3, as kube-scheduler's
    search would find it, where before the node was passed over."""
    node = node_of("a", 16000, 16000, 16000, 16000, links=(Link(0, 1, 12), Link(2, 3, 12)))
    ledger = held(NodeLedger(node), 1, 8000)
    requests = (RequestAsk("a", (("a", Request(1)),)), RequestAsk("b", (("b", Request(1)),)))
    ask = ClaimAsk(REF, requests, linked=(Linked(2, ("a", "b")),))
    for policy in ("default", "binpack", "bestfit", "spread"):
        found = place_claim([ledger], ask, make_policy(policy), ID, 0.0, slots_per_card=8)
        cards = sorted(s.index for s in found.allocation.shares())
        assert cards == [2, 3], (policy, cards)
    unlinked = ClaimAsk(REF, requests)
    found = place_claim([ledger], unlinked, make_policy("default"), ID, 0.0, slots_per_card=8)
    assert sorted(s.index for s in found.allocation.shares()) != [2, 3]  # the policy's own choice, unconstrained


def test_linked_cards_must_be_in_one_published_group_not_only_linked_to_each_other() -> None:
    """A DGX-1's cross links join card 0 to card 4, but the node publishes them in different
    groups of two (0-1, 4-5, ...): with every other card held, a claim matching nvlinkGroup2 may
    not take 0 and 4 (Kubernetes would read its constraint as broken), and takes a real pair once
    one is free."""
    quads = tuple(Link(a, b, 1) for q in (0, 4) for a in range(q, q + 4) for b in range(a + 1, q + 4))
    node = node_of("dgx", *[16000] * 8, links=(*quads, *(Link(i, i + 4, 1) for i in range(4))))
    ledger = NodeLedger(node)
    for index in (1, 2, 3, 5, 6, 7):
        ledger = held(ledger, index, 16000, f"h{index}")
    ask = ClaimAsk(REF, (RequestAsk("gpu", (("gpu", Request(2)),)),), linked=(Linked(2, ("gpu",)),))
    with pytest.raises(Exhausted, match="cards 0, 4 for gpu are not in one NVLink group of 2"):
        place_claim([ledger], ask, make_policy("default"), ID, 0.0, slots_per_card=8)
    freed = NodeLedger(node, tuple(a for a in ledger.allocations if a.owner.name != "h5"))
    found = place_claim([freed], ask, make_policy("default"), ID, 0.0, slots_per_card=8)
    assert sorted(s.index for s in found.allocation.shares()) == [4, 5]


def test_no_node_names_each_nodes_reason_the_hosts_included() -> None:
    full = held(NodeLedger(node_of("a", 16000)), 0, 16000)
    busy = NodeLedger(node_of("b", 16000))

    def host(name: NodeName) -> str:
        return "needs 4 CPUs, 1 free" if name == "b" else ""

    with pytest.raises(Exhausted) as refused:
        place_claim([full, busy], one(Request(1, 8000, 500)), make_policy("default"), ID, 0.0, slots_per_card=8,
                    host=host)  # fmt: skip
    said = str(refused.value)
    assert said.startswith("ResourceClaim ns/c (uid uid-1) fits on no node: a: ") and "b: needs 4 CPUs, 1 free" in said


memories = st.sampled_from([8000, 16000, 24000, 40000])


@st.composite
def cluster(draw: Any) -> list[NodeLedger]:
    ledgers = []
    for n in range(draw(st.integers(1, 4))):
        ledger = NodeLedger(node_of(f"n{n}", *draw(st.lists(memories, min_size=1, max_size=4))))
        for index, c in enumerate(ledger.node.cards):
            used = draw(st.sampled_from([0, 0, 1000, 4000, c.memory_mib]))
            if used:
                ledger = held(ledger, index, used)
        ledgers.append(ledger)
    return ledgers


@settings(max_examples=150, deadline=None)
@given(
    ledgers=cluster(),
    request=st.one_of(
        st.builds(Request, st.integers(1, 2)),
        st.builds(Request, st.just(1), st.sampled_from([1000, 4000, 9000]), st.sampled_from([100, 500, 1000])),
    ),
    policy=st.sampled_from(["default", "binpack", "bestfit", "spread"]),
    hosts=st.lists(st.tuples(st.sampled_from([2000, 8000, 32000]), st.sampled_from([4096, 65536])), min_size=4),
    pod=st.tuples(st.sampled_from([0, 1000, 6000]), st.sampled_from([0, 2048, 32768])),
)
def test_a_one_request_claim_lands_where_the_classic_path_would_put_the_pod(
    ledgers: list[NodeLedger],
    request: Request,
    policy: str,
    hosts: list[tuple[int, int]],
    pod: tuple[int, int],
) -> None:
    """The same node and cards as classic placement's choice for a pod asking the same cards, CPU
    and memory on nodes with the same free CPU and memory (the policy's best node, the first of
    equals), or no node for both."""
    chosen = make_policy(policy)
    free = {str(x.node.name): hosts[i] for i, x in enumerate(ledgers)}

    def state(ledger: NodeLedger) -> NodeState:
        cpu, mem = free[str(ledger.node.name)]
        return from_ledger(ledger, cpu_free=cpu, mem_free=mem, cpu_total=64000, mem_total=262144, slots_per_card=8)

    def host(node: str) -> str:
        cpu, mem = free[node]
        return "" if pod[0] <= cpu and pod[1] <= mem else "no room on the host"

    classic = place([state(x) for x in ledgers], Ask(request, pod[0], pod[1]), chosen)
    try:
        found = place_claim(
            ledgers, one(request), chosen, ID, 0.0, slots_per_card=8,
            host=host, cpu_milli=pod[0], memory_mib=pod[1], state=state,
        ).allocation  # fmt: skip
    except Exhausted:
        assert not isinstance(classic, Decision)
        return
    assert isinstance(classic, Decision)
    assert (found.node, tuple(s.index for s in found.shares())) == (classic.node, classic.cards)


def test_the_random_policy_draws_any_node_that_takes_the_claim_from_the_callers_rng() -> None:
    """As classic pods get any fitting node under ``random``: with the caller's ``rng``, every node
    that takes the claim is drawn; a node that does not (full) never is. Without one, the first by
    name, as any policy on a tie."""
    full = held(NodeLedger(node_of("a-full", 16000)), 0, 16000)
    free = [NodeLedger(node_of(name, 16000)) for name in ("b", "c", "d")]
    policy, ask = make_policy("random"), one(Request(1, 4000, 250))
    rng = Random(7)
    drawn = {str(place_claim([full, *free], ask, policy, ID, 0.0, slots_per_card=8, rng=rng).allocation.node)
             for _ in range(60)}  # fmt: skip
    assert drawn == {"b", "c", "d"}
    firsts = {str(place_claim([full, *free], ask, policy, ID, 0.0, slots_per_card=8).allocation.node) for _ in range(5)}
    assert firsts == {"b"}
    binpack = {str(place_claim(free, ask, make_policy("binpack"), ID, 0.0, slots_per_card=8, rng=rng).allocation.node)
               for _ in range(10)}  # fmt: skip
    assert binpack == {"b"}  # the rng serves a randomized policy only
