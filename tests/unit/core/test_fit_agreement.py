"""Every fit agrees with the ledger: what placement and the allocator choose, ``reserve`` takes.

The claims, over random nodes (cards of several models and sizes, a card of unknown memory size
among them, unhealthy cards, links), random live and released allocations already there (of both
isolation tiers, shared or whole, init containers among them, some on a card the node lost), kubelet
slots per card counted or not, tiers mixing or not, and random pods:

1. **Placement's choices are taken.** For every policy in ``POLICIES``, a ``Decision`` of
   ``place`` on the node's ``from_ledger`` state, made into grants as ``pods.plan`` makes them
   (``placement.shares``), is reserved by ``pods.reserve_grants`` (device IDs assigned, then the
   ledger's ``reserve``), the binder's write; so are ``pods.plan``'s grants for a pod of several
   containers, init containers among them.
2. **The allocator's choices are taken.** ``fit.fit_node``'s grants, made into the allocation the
   allocator writes (``ledger.reservation``), leave no card short of slots (``slots.slot_problem``)
   and ``reserve`` takes them.
3. **What the ledger would take, the fits find.** For a pod of one app container: when ``reserve``
   takes the container's shares on some ``count`` distinct cards of an allowed model (slots
   checked as the writers check them), placement's filter (``placement.fit.problem``) passes the
   node, every policy's ``place`` decides on it, and ``fit_node`` finds cards; when no such cards
   exist, the filter names a reason and ``fit_node`` raises ``Exhausted``.

Restrictions, where a claim cannot hold: claim 3 is for one app container, because the fits place
a pod's containers one after another (the tightest card for each), which can miss an assignment
that a search over all of them would find; it is about cards only, so the node's CPU and memory
are untracked (the ledger knows neither), no guard, and the node not stale. The topology and the
policies' preferences choose among the cards that fit; none of the claims is about which.
"""

from __future__ import annotations

import contextlib
from itertools import combinations
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, Tier, fit_node, share_for
from gpuledger_core.ids import AllocationId, CardUuid
from gpuledger_core.ledger import NodeLedger, reservation, reserve
from gpuledger_core.model import (
    CORE_WHOLE,
    Allocation,
    AllocState,
    Card,
    CardShare,
    Grant,
    Health,
    Isolation,
    Link,
    Node,
    Owner,
    OwnerKind,
    PcieLevel,
    Request,
)
from gpuledger_core.packing import POLICIES, Decision, TypicalPod, from_ledger, make_policy, place, shares
from gpuledger_core.packing.fit import problem
from gpuledger_core.pods import PodAsk, plan, reserve_grants
from gpuledger_core.slots import assign_device_ids, slot_problem

from .builders import NODE, uuid_of

pytestmark = pytest.mark.timeout(120)
EXAMPLES = 300

MODELS = ("A100", "T4", "H100")
MEMORIES = (0, 8000, 16000, 40960)  # 0: the inventory could not read the card's size
GONE = CardUuid("GPU-gone")  # a card the node no longer reports, still held
TYPICAL = (TypicalPod(2000, 1, 1000), TypicalPod(1000, 1, 300), TypicalPod(4000, 2, 1000), TypicalPod(500, 0, 0))
NEW = AllocationId("new")
OWNER = Owner(OwnerKind.POD, "uid-new", "ns", "new")


@st.composite
def nodes(draw: st.DrawFn) -> Node:
    size = draw(st.integers(1, 5))
    indexes = draw(st.permutations(range(size)))
    cards = tuple(
        Card(
            uuid_of(i),
            i,
            draw(st.sampled_from(MODELS)),
            draw(st.sampled_from(MEMORIES)),
            numa=draw(st.sampled_from([None, 0, 1])),
            health=draw(st.sampled_from([Health.HEALTHY, Health.HEALTHY, Health.HEALTHY, Health.UNHEALTHY])),
        )
        for i in indexes
    )
    pairs = list(combinations(range(size), 2))
    linked = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=4)) if pairs else []
    links = tuple(Link(a, b, draw(st.integers(0, 4)), draw(st.sampled_from(PcieLevel))) for a, b in linked)
    return Node(NODE, cards, links)


@st.composite
def held_shares(draw: st.DrawFn, node: Node) -> tuple[CardShare, ...]:
    uuids = [c.uuid for c in node.cards] + [GONE]
    chosen = draw(st.lists(st.sampled_from(uuids), min_size=1, max_size=2, unique=True))
    out = []
    for uuid in chosen:
        card = node.card(uuid)
        index = card.index if card is not None else 99
        if draw(st.booleans()) and draw(st.booleans()):
            out.append(CardShare(uuid, index, card.memory_mib if card else 8000, CORE_WHOLE, exclusive=True))
        else:
            mem = draw(st.sampled_from([0, 1000, 4000, 9000]))
            out.append(CardShare(uuid, index, mem, draw(st.sampled_from([0, 100, 500, 1000]))))
    return tuple(out)


@st.composite
def held(draw: st.DrawFn, node: Node) -> tuple[Allocation, ...]:
    """Allocations already on the node: a pod's hold its kubelet device IDs (while 8 slots a card
    have room for them), a tool's none; not all of them fitting what is there now."""
    out: list[Allocation] = []
    for n in range(draw(st.integers(0, 5))):
        grants = tuple(
            Grant(f"c{g}", draw(held_shares(node)), init=draw(st.booleans()) and g == 0)
            for g in range(draw(st.integers(1, 2)))
        )
        pod = draw(st.booleans())
        allocation = Allocation(
            AllocationId(f"held-{n}"),
            Owner(OwnerKind.POD if pod else OwnerKind.TOOL, f"h{n}"),
            NODE,
            grants,
            state=draw(st.sampled_from([AllocState.RESERVED, AllocState.BOUND, AllocState.RELEASED])),
            isolation=draw(st.sampled_from(Isolation)),
        )
        if pod:
            with contextlib.suppress(Exhausted):
                allocation = assign_device_ids(NodeLedger(node, tuple(out)), allocation, 8)
        out.append(allocation)
    return tuple(out)


@st.composite
def ledgers(draw: st.DrawFn) -> NodeLedger:
    node = draw(nodes())
    return NodeLedger(node, draw(held(node)))


@st.composite
def requests(draw: st.DrawFn) -> Request:
    count = draw(st.integers(1, 3))
    models = draw(st.sampled_from([frozenset(), frozenset({"A100"}), frozenset({"T4", "H100"})]))
    if draw(st.integers(0, 3)) == 0:
        return Request(count, models=models)
    mem = draw(st.sampled_from([None, 500, 4000, 8000, 16000]))
    core = draw(st.sampled_from([None, 50, 300, 1000] if mem else [50, 300, 1000]))
    return Request(count, mem, core, models)


@st.composite
def pods(draw: st.DrawFn, containers: int = 3) -> PodAsk:
    drawn = draw(st.lists(st.tuples(requests(), st.booleans()), min_size=1, max_size=containers))
    asks = sorted((ContainerAsk(f"c{n}", r, init) for n, (r, init) in enumerate(drawn)), key=lambda a: not a.init)
    return PodAsk(OWNER, tuple(asks), draw(st.sampled_from(Isolation)))


slots_counted = st.sampled_from([1, 2, 3, 8])
PROPERTY = settings(max_examples=EXAMPLES, deadline=None)


def write(ledger: NodeLedger, pod: PodAsk, grants: tuple[Grant, ...], slots: int, mix: bool) -> NodeLedger:
    """Placement's binder's write of ``grants``; a refusal is a disagreement with the fit."""
    try:
        return reserve_grants(ledger, pod, NEW, grants, now=0.0, lease_s=30.0, slots_per_card=slots, mix_isolation=mix)
    except Exhausted as err:
        raise AssertionError(f"the fit chose {hint(grants)}, the ledger refuses: {err}") from err


def hint(grants: tuple[Grant, ...]) -> list[list[int]]:
    return [[s.index for s in g.cards] for g in grants]


@PROPERTY
@given(ledgers(), pods(), slots_counted, st.booleans())
def test_every_placement_choice_is_taken_by_the_ledger(ledger: NodeLedger, pod: PodAsk, slots: int, mix: bool) -> None:
    state = from_ledger(ledger, slots_per_card=slots, mix_isolation=mix)
    single = pod.single()
    for name in POLICIES:
        policy = make_policy(name, TYPICAL)
        if single is not None:
            found = place([state], single, policy, rng=Random(7))
            if isinstance(found, Decision):
                (container,) = pod.containers
                write(ledger, pod, (Grant(container.container, shares(ledger.node, single, found)),), slots, mix)
        try:
            grants = plan(ledger, pod, policy, slots_per_card=slots, mix_isolation=mix)
        except Exhausted:
            continue
        write(ledger, pod, grants, slots, mix)


@PROPERTY
@given(ledgers(), pods(), st.none() | slots_counted, st.booleans())
def test_every_allocator_choice_is_taken_by_the_ledger(
    ledger: NodeLedger, pod: PodAsk, slots: int | None, mix: bool
) -> None:
    try:
        grants = fit_node(ledger, pod.containers, slots, Tier(pod.isolation, mix))
    except Exhausted:
        return
    allocation = allocator_write(ledger, pod, grants)
    assert not slots or not slot_problem(ledger, allocation, slots), f"fit chose {hint(grants)}"
    try:
        reserve(ledger, allocation, mix_isolation=mix)
    except Exhausted as err:
        raise AssertionError(f"the allocator's fit chose {hint(grants)}, the ledger refuses: {err}") from err


def allocator_write(ledger: NodeLedger, pod: PodAsk, grants: tuple[Grant, ...]) -> Allocation:
    requests_ = [c.request for c in pod.containers]
    return reservation(NEW, OWNER, ledger.node.name, grants, requests_, isolation=pod.isolation, now=0.0, lease_s=30.0)


def ledger_takes(ledger: NodeLedger, pod: PodAsk, cards: tuple[Card, ...], slots: int | None, mix: bool) -> bool:
    """Whether the ledger reserves the pod's one container on ``cards``, slots counted as the
    allocator counts them for a hinted reservation (``slot_problem``, then ``reserve``)."""
    (container,) = pod.containers
    grants = (Grant(container.container, tuple(share_for(c, container.request) for c in cards)),)
    allocation = allocator_write(ledger, pod, grants)
    if slots is not None and slot_problem(ledger, allocation, slots):
        return False
    try:
        reserve(ledger, allocation, mix_isolation=mix)
    except Exhausted:
        return False
    return True


def some_cards_taken(ledger: NodeLedger, pod: PodAsk, slots: int | None, mix: bool) -> tuple[Card, ...] | None:
    (container,) = pod.containers
    allowed = [c for c in ledger.node.cards if container.request.allows(c.model)]
    for cards in combinations(allowed, container.request.count):
        if ledger_takes(ledger, pod, cards, slots, mix):
            return cards
    return None


one_app_container = pods(containers=1).filter(lambda p: not p.containers[0].init)


@PROPERTY
@given(ledgers(), one_app_container, st.none() | slots_counted, st.booleans())
def test_what_the_ledger_would_take_the_fits_find(
    ledger: NodeLedger, pod: PodAsk, slots: int | None, mix: bool
) -> None:
    taken = some_cards_taken(ledger, pod, slots, mix)
    state = from_ledger(ledger, slots_per_card=slots, mix_isolation=mix)
    ask = pod.single()
    assert ask is not None
    why = problem(state, ask)
    try:
        fit_node(ledger, pod.containers, slots, Tier(pod.isolation, mix))
        allocator = ""
    except Exhausted as err:
        allocator = str(err)
    if taken is None:
        assert why, "placement's filter passes a node where the ledger takes the pod on no cards"
        assert allocator, "the allocator's fit finds cards where the ledger takes the pod on none"
        return
    where = [c.index for c in taken]
    assert not why, f"the ledger takes cards {where}, placement's filter says: {why}"
    assert not allocator, f"the ledger takes cards {where}, the allocator's fit says: {allocator}"
    for name in POLICIES:
        found = place([state], ask, make_policy(name, TYPICAL), rng=Random(7))
        assert isinstance(found, Decision), f"the ledger takes cards {where}, {name} says: {found}"
