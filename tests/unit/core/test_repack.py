"""Defragmentation's choice: the fewest movable holders moved off one node so that a pod fits there,
each of them fitting on another node; nothing for a pod that would still not fit, nothing moved that
would not fit again, never a holder that is not movable, never more than the budget's moves."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Card, CardMode, Grant, Node, Owner, OwnerKind, Request
from gpuledger_core.packing import make_policy
from gpuledger_core.pods import PodAsk
from gpuledger_core.preemption import Fit, Holder
from gpuledger_core.repack import ask_of, repack

from .builders import allocation, card, share
from .test_mig_ledger import A100, instance_share, mig_card

FIT = Fit(make_policy("bestfit"), slots_per_card=8)
GIB = 1024
PENDING = Owner(OwnerKind.POD, "uid-pending", "ns", "pending")


def pod(mem_mib: int) -> PodAsk:
    return PodAsk(PENDING, (ContainerAsk("main", Request(1, mem_mib=mem_mib)),))


def held(name: str, node: str, index: int, mem_mib: int) -> Allocation:
    """A holder of ``mem_mib`` on card ``index`` of ``node``, with the request it was placed for."""
    found = allocation(name, Grant("main", (share(index, mem_mib, 100),)), name=NodeName(node))
    return replace(found, requests=(Request(1, mem_mib=mem_mib),))


def two_card_node(name: str, *holders: tuple[str, int, int]) -> NodeLedger:
    node = Node(NodeName(name), (card(0, 8 * GIB), card(1, 8 * GIB)))
    return NodeLedger(node, tuple(held(h, name, index, mem) for h, index, mem in holders))


def movable(*ledgers: NodeLedger, only: Iterable[str] | None = None) -> dict[str, Holder]:
    return {a.owner.key: Holder(0, started_at=1.0) for ledger in ledgers for a in ledger.live()
            if only is None or a.id in set(only)}  # fmt: skip


def test_the_fewest_movable_holders_go_to_another_node_and_the_pod_fits_where_they_were() -> None:
    # a: card 0 has 4 + 3 GiB (1 free), card 1 has 2 + 2 + 2 (2 free); b: 4 GiB free on each card.
    # A 5 GiB pod fits nowhere. Moving a's 4 GiB (to b) frees 5 GiB on card 0: one move. Card 1
    # would take two (2 + 2), and b's own holders (4 GiB each) fit nowhere else.
    a = two_card_node("a", ("a4", 0, 4 * GIB), ("a3", 0, 3 * GIB), ("x", 1, 2 * GIB), ("y", 1, 2 * GIB),
                      ("z", 1, 2 * GIB))  # fmt: skip
    b = two_card_node("b", ("b4", 0, 4 * GIB), ("c4", 1, 4 * GIB))
    found = repack([a, b], pod(5 * GIB), movable(a, b), FIT, now=10.0, max_moves=3)
    assert found is not None
    assert found.node == "a" and [m.allocation.id for m in found.moves] == ["a4"]
    assert found.moves[0].to == "b"
    assert found.grants[0].cards[0].index == 0
    # b with 3 GiB free a card: a4 fits there no more; the cheapest set that does is two 2 GiB of card 1.
    tighter = two_card_node("b", ("b5", 0, 5 * GIB), ("c5", 1, 5 * GIB))
    found = repack([a, tighter], pod(5 * GIB), movable(a, tighter), FIT, now=10.0, max_moves=3)
    assert found is not None and found.node == "a"
    assert len(found.moves) == 2 and {m.allocation.id for m in found.moves} < {"x", "y", "z"}
    assert found.grants[0].cards[0].index == 1
    # The pod may go to b only: b's holders have nowhere to go, so nothing is moved.
    assert repack([a, b], pod(5 * GIB), movable(a, b), FIT, now=10.0, max_moves=3, targets={NodeName("b")}) is None


def test_nothing_moves_when_a_moved_holder_would_fit_nowhere_or_the_budget_is_too_small() -> None:
    a = two_card_node("a", ("a4", 0, 4 * GIB), ("a3", 0, 3 * GIB), ("x", 1, 2 * GIB), ("y", 1, 2 * GIB),
                      ("z", 1, 2 * GIB))  # fmt: skip
    full = two_card_node("b", ("b7", 0, 7 * GIB), ("c7", 1, 7 * GIB))  # 1 GiB free each: a4 fits nowhere
    assert repack([a, full], pod(5 * GIB), movable(a, full), FIT, now=10.0, max_moves=3) is None
    b = two_card_node("b", ("b5", 0, 5 * GIB), ("c5", 1, 5 * GIB))
    assert repack([a, b], pod(5 * GIB), movable(a, b), FIT, now=10.0, max_moves=0) is None
    # Only the 2 GiB holders may move: two of them (to b, one a card) free card 1.
    found = repack([a, b], pod(5 * GIB), movable(a, b, only={"x", "y", "z"}), FIT, now=10.0, max_moves=3)
    assert found is not None and len(found.moves) == 2 and {m.to for m in found.moves} == {"b"}
    assert repack([a, b], pod(5 * GIB), movable(a, b, only={"x", "y", "z"}), FIT, now=10.0, max_moves=1) is None
    # The host refuses node b for every moved pod: nowhere to go.
    assert repack([a, b], pod(5 * GIB), movable(a, b), FIT, now=10.0, max_moves=3, host=lambda _a, n: n != "b") is None


def test_only_the_target_nodes_are_cleared_and_the_others_still_take_moved_holders() -> None:
    # Both a and c could be cleared with one move to b; with targets={c} only c is, a4 stays.
    a = two_card_node("a", ("a4", 0, 4 * GIB), ("a3", 0, 3 * GIB), ("x", 1, 4 * GIB), ("y", 1, 3 * GIB))
    c = two_card_node("c", ("c4", 0, 4 * GIB), ("c3", 0, 3 * GIB), ("w", 1, 4 * GIB), ("v", 1, 3 * GIB))
    b = two_card_node("b", ("b4", 0, 4 * GIB), ("b5", 1, 5 * GIB))  # 4 GiB free on card 0, 3 on card 1
    ledgers = [a, b, c]
    found = repack(ledgers, pod(5 * GIB), movable(*ledgers), FIT, now=10.0, max_moves=3)
    assert found is not None and found.node == "a"
    found = repack(ledgers, pod(5 * GIB), movable(*ledgers), FIT, now=10.0, max_moves=3, targets={NodeName("c")})
    assert found is not None and found.node == "c" and {m.to for m in found.moves} == {"b"}
    assert repack(ledgers, pod(5 * GIB), movable(*ledgers), FIT, now=10.0, max_moves=3, targets={NodeName("b")}) is None


def test_a_pod_that_fits_already_or_would_not_fit_even_on_an_empty_node_moves_nobody() -> None:
    a = two_card_node("a", ("a4", 0, 4 * GIB))
    b = two_card_node("b", ("b5", 0, 5 * GIB))
    assert repack([a, b], pod(5 * GIB), movable(a, b), FIT, now=10.0, max_moves=3) is None  # fits on a's card 1
    assert repack([a, b], pod(9 * GIB), movable(a, b), FIT, now=10.0, max_moves=3) is None  # fits no card at all


def test_an_entry_without_its_requests_is_never_moved() -> None:
    old = allocation("old", Grant("main", (share(0, 4 * GIB, 100),)), name=NodeName("a"))
    assert ask_of(old) is None
    a = NodeLedger(two_card_node("a").node, (old, held("a3", "a", 0, 3 * GIB), held("x", "a", 1, 7 * GIB)))
    b = two_card_node("b")
    assert repack([a, b], pod(5 * GIB), movable(a, b, only={"old"}), FIT, now=10.0, max_moves=3) is None


@st.composite
def fleets(draw: st.DrawFn) -> list[NodeLedger]:
    ledgers = []
    for n in range(draw(st.integers(2, 3))):
        name = f"n{n}"
        use = [0, 0]
        holders = []
        for i in range(draw(st.integers(0, 8))):
            index, mem = draw(st.integers(0, 1)), draw(st.sampled_from([GIB, 2 * GIB, 3 * GIB, 4 * GIB]))
            if use[index] + mem <= 8 * GIB:
                use[index] += mem
                holders.append((f"{name}-{i}", index, mem))
        ledgers.append(two_card_node(name, *holders))
    return ledgers


@settings(max_examples=150, deadline=None)
@given(fleets(), st.sampled_from([3 * GIB, 5 * GIB, 7 * GIB]), st.integers(1, 4), st.data())
def test_a_repack_makes_the_pod_fit_and_every_moved_holder_fit_elsewhere(
    ledgers: list[NodeLedger], mem: int, budget: int, data: st.DataObject
) -> None:
    everyone = [a.id for ledger in ledgers for a in ledger.live()]
    allowed = set(data.draw(st.lists(st.sampled_from(everyone), unique=True))) if everyone else set()
    found = repack(ledgers, pod(mem), movable(*ledgers, only=allowed), FIT, now=10.0, max_moves=budget)
    if found is None:
        return
    assert all(FIT.grants(ledger, pod(mem), ()) is None for ledger in ledgers)  # it fitted nowhere before
    assert 1 <= len(found.moves) <= budget and all(m.allocation.id in allowed for m in found.moves)
    target = next(ledger for ledger in ledgers if ledger.node.name == found.node)
    assert FIT.grants(target, pod(mem), [m.allocation.id for m in found.moves]) is not None
    after = {ledger.node.name: ledger for ledger in ledgers}
    for move in found.moves:  # in order, each fits where it goes, never on the node it clears
        assert move.to != found.node and move.allocation.node == found.node
        ask = ask_of(move.allocation)
        assert ask is not None and FIT.grants(after[move.to], ask, ()) is not None
        placed = replace(move.allocation, node=move.to, grants=move.grants)
        after[move.to] = NodeLedger(after[move.to].node, (*after[move.to].allocations, placed))


# --- MIG: a holder of an instance moves to a free placement of its profile on another node ---


def mig_held(name: str, node: str, at: Card, profile: str, start: int) -> Allocation:
    found = allocation(name, Grant("main", (instance_share(at, profile, start),)), name=NodeName(node))
    return replace(found, requests=(Request(1, mig=profile),))


def mig_node(name: str, *holders: tuple[str, str, int], mode: CardMode = CardMode.MIG) -> NodeLedger:
    """One A100 40 GB card (in ``mode``) holding ``holders``: (name, profile, start)."""
    at = replace(mig_card(0), mode=mode)
    return NodeLedger(Node(NodeName(name), (at,)), tuple(mig_held(h, name, at, p, s) for h, p, s in holders))


def mig_pod(profile: str) -> PodAsk:
    return PodAsk(PENDING, (ContainerAsk("main", Request(1, mig=profile)),))


def test_a_mig_holder_moves_to_a_free_placement_elsewhere_and_a_mig_pod_takes_the_card_it_left() -> None:
    a = mig_node("a", ("small", "1g.5gb", 0))  # a 7g.40gb needs the whole card
    b = mig_node("b", ("fixed", "3g.20gb", 4))  # room for the 1g.5gb at 0-3, not for a 7g.40gb
    found = repack([a, b], mig_pod("7g.40gb"), movable(a, b, only={"small"}), FIT, now=10.0, max_moves=1)
    assert found is not None and found.node == "a"
    (move,) = found.moves
    assert move.allocation.id == "small" and move.to == "b"
    (moved,) = move.grants[0].cards
    assert moved.mig is not None and moved.mig.profile == "1g.5gb" and moved.mig.start < 4
    (taken,) = found.grants[0].cards
    assert taken.mig is not None and (taken.mig.profile, taken.mig.start) == ("7g.40gb", 0)


def test_a_mig_holder_goes_nowhere_but_a_card_in_mig_mode() -> None:
    a = mig_node("a", ("small", "1g.5gb", 0))
    whole = NodeLedger(Node(NodeName("b"), (card(0, 40960, model=A100),)))
    assert repack([a, whole], mig_pod("7g.40gb"), movable(a, only={"small"}), FIT, now=10.0, max_moves=1) is None
    full = mig_node("b", ("fixed", "7g.40gb", 0))
    assert repack([a, full], mig_pod("7g.40gb"), movable(a, only={"small"}), FIT, now=10.0, max_moves=1) is None
