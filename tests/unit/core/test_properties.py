"""Properties of the ledger over random nodes and random sequences of operations."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core import codec
from gpuledger_core.errors import Exhausted, FailedPrecondition
from gpuledger_core.events import EventKind, LedgerEvent, diff
from gpuledger_core.fit import ContainerAsk, fit_node, share_for
from gpuledger_core.ids import AllocationId, CardUuid
from gpuledger_core.ledger import NodeLedger, commit, expire, prune, release, reserve, tidy, with_node
from gpuledger_core.model import (
    CORE_WHOLE,
    Allocation,
    AllocState,
    Card,
    Grant,
    Health,
    Node,
    Owner,
    OwnerKind,
    Request,
)

from .builders import NODE, uuid_of

MODELS = ("Tesla P4", "Tesla T4")
PROPERTY = settings(max_examples=100, deadline=None)


# ---- what a scenario is made of -------------------------------------------------------------


@dataclass(frozen=True)
class Reserve:
    asks: tuple[ContainerAsk, ...]
    lease_s: float | None


@dataclass(frozen=True)
class Commit:
    pick: int


@dataclass(frozen=True)
class Release:
    pick: int


@dataclass(frozen=True)
class Tidy:
    keep_s: float | None  # None: expire only


@dataclass(frozen=True)
class SetHealth:
    index: int
    healthy: bool


Op = Reserve | Commit | Release | Tidy | SetHealth


def _node(specs: list[tuple[str, int, bool]]) -> Node:
    cards = tuple(
        Card(uuid_of(i), i, model, memory, health=Health.HEALTHY if healthy else Health.UNHEALTHY)
        for i, (model, memory, healthy) in enumerate(specs)
    )
    return Node(NODE, cards)


MOST_MIB = 81920
NODES = st.lists(
    st.tuples(st.sampled_from(MODELS), st.integers(1000, MOST_MIB), st.sampled_from([True] * 4 + [False])),
    min_size=1,
    max_size=8,
).map(_node)
REQUESTS = st.one_of(
    st.builds(Request, count=st.integers(1, 3)),
    st.builds(
        Request,
        count=st.integers(1, 3),
        mem_mib=st.none() | st.integers(1, 20_000),
        core_milli=st.sampled_from([250, 400, 500, 600, 1000]) | st.integers(1, CORE_WHOLE),
    ),
    st.builds(Request, count=st.integers(1, 2), mem_mib=st.integers(1, MOST_MIB)),
    st.builds(
        Request,
        mem_mib=st.integers(1, 4000),
        models=st.sampled_from(MODELS).map(lambda m: frozenset({m})),
    ),
)
ASKS = st.lists(st.builds(ContainerAsk, st.just(""), REQUESTS, st.booleans()), min_size=1, max_size=3).map(
    lambda xs: tuple(replace(ask, container=f"c{i}") for i, ask in enumerate(xs))
)
SINGLE = REQUESTS.map(lambda q: (ContainerAsk("main", q),))
LEASES = st.none() | st.floats(1, 120)
OPS: st.SearchStrategy[Op] = st.one_of(
    st.builds(Reserve, SINGLE, LEASES),
    st.builds(Reserve, SINGLE, LEASES),
    st.builds(Reserve, ASKS, LEASES),
    st.builds(Commit, st.integers(0, 50)),
    st.builds(Release, st.integers(0, 50)),
    st.builds(Tidy, st.none() | st.sampled_from([0.0, 30.0, 600.0])),
    st.builds(SetHealth, st.integers(0, 7), st.booleans()),
)
Scenario = tuple[Node, list[tuple[float, Op]]]
SCENARIOS: st.SearchStrategy[Scenario] = st.tuples(
    NODES, st.lists(st.tuples(st.floats(0, 90), OPS), min_size=1, max_size=25)
)


# ---- running a scenario ---------------------------------------------------------------------


@dataclass
class Run:
    states: list[NodeLedger]
    ids: list[AllocationId] = field(default_factory=list)


def run(node: Node, steps: list[tuple[float, Op]]) -> Run:
    result = Run([NodeLedger(node)])
    now = 0.0
    for dt, op in steps:
        now += dt
        result.states.extend(apply(result, result.states[-1], op, now))
    return result


def apply(result: Run, state: NodeLedger, op: Op, now: float) -> list[NodeLedger]:
    """The ledger values one operation writes, in order."""
    if isinstance(op, Reserve):
        return [place(result, state, op, now)]
    if isinstance(op, Commit | Release):
        if not result.ids:
            return [state]
        target = result.ids[op.pick % len(result.ids)]
        if state.get(target) is None:  # forgotten by prune
            return [state]
        return [settle(state, op, target, now)]
    if isinstance(op, Tidy):
        # expiry and forgetting as two writes, so every release is seen before it is forgotten
        expired = expire(state, now)
        return [expired] if op.keep_s is None else [expired, prune(expired, now, op.keep_s)]
    cards = tuple(
        replace(c, health=Health.HEALTHY if op.healthy else Health.UNHEALTHY)
        if c.index == op.index % len(state.node.cards)
        else c
        for c in state.node.cards
    )
    return [with_node(state, replace(state.node, cards=cards))]


def settle(state: NodeLedger, op: Commit | Release, target: AllocationId, now: float) -> NodeLedger:
    if isinstance(op, Release):
        return release(state, target, now)
    found = state.get(target)
    assert found is not None
    if found.state is AllocState.RELEASED:
        with pytest.raises(FailedPrecondition):
            commit(state, target, now)
        return state
    return commit(state, target, now)


def place(result: Run, state: NodeLedger, op: Reserve, now: float) -> NodeLedger:
    new_id = AllocationId(f"a{len(result.ids)}")
    try:
        grants = fit_node(state, op.asks)
    except Exhausted:
        if len(op.asks) == 1 and not op.asks[0].init:
            check_forcing_is_refused(state, op.asks[0].request, new_id)
        return state
    for grant, ask in zip(grants, op.asks, strict=True):
        assert len(grant.cards) == ask.request.count
        for s in grant.cards:
            chosen = state.node.card(s.uuid)
            assert chosen is not None
            assert chosen.healthy, "fit chose an unhealthy card"
            assert ask.request.allows(chosen.model), "fit ignored the model selector"
    if len(op.asks) == 1 and not op.asks[0].init:
        allowed = one_card_fits(state, op.asks[0].request, new_id)
        assert {s.uuid for s in grants[0].cards} <= allowed
    lease = None if op.lease_s is None else now + op.lease_s
    owner = Owner(OwnerKind.POD, f"uid-{new_id}")
    new = Allocation(new_id, owner, NODE, grants, created_at=now, updated_at=now, lease_expires_at=lease)
    after = reserve(state, new)
    result.ids.append(new_id)
    return after


def forced(request: Request, cards: list[Card], new_id: AllocationId) -> Allocation:
    grant = Grant("main", tuple(share_for(c, request) for c in cards))
    return Allocation(new_id, Owner(OwnerKind.TOOL, "forcer"), NODE, (grant,))


def one_card_fits(state: NodeLedger, request: Request, new_id: AllocationId) -> set[CardUuid]:
    """The cards (of an allowed model) that ``reserve`` accepts this request's share on."""
    fits: set[CardUuid] = set()
    for c in state.node.cards:
        if not request.allows(c.model):
            continue
        try:
            reserve(state, forced(request, [c], new_id))
        except Exhausted:
            continue
        fits.add(c.uuid)
    return fits


def check_forcing_is_refused(state: NodeLedger, request: Request, new_id: AllocationId) -> None:
    """fit refused: the ledger refuses too, even on the most favourable cards one could force."""
    fits = one_card_fits(state, request, new_id)
    assert len(fits) < request.count, f"fit refused but {len(fits)} card(s) would take {request}"
    allowed = [c for c in state.node.cards if request.allows(c.model)]
    if len(allowed) < request.count:
        return  # not even enough cards of the model to force onto
    best = sorted(allowed, key=lambda c: c.uuid not in fits)[: request.count]
    with pytest.raises(Exhausted):
        reserve(state, forced(request, best, new_id))


# ---- an independent account of what each card carries --------------------------------------


@dataclass
class Load:
    mem_mib: int = 0
    core_milli: int = 0
    holders: set[AllocationId] = field(default_factory=set)
    exclusive: bool = False


def loads(state: NodeLedger) -> dict[CardUuid, Load]:
    total: dict[CardUuid, Load] = defaultdict(Load)
    for a in state.allocations:
        if a.state is AllocState.RELEASED:
            continue
        app: dict[CardUuid, list[int]] = defaultdict(lambda: [0, 0])
        init: dict[CardUuid, list[int]] = defaultdict(lambda: [0, 0])
        for grant in a.grants:
            for s in grant.cards:
                if grant.init:
                    init[s.uuid] = [max(init[s.uuid][0], s.mem_mib), max(init[s.uuid][1], s.core_milli)]
                else:
                    app[s.uuid] = [app[s.uuid][0] + s.mem_mib, app[s.uuid][1] + s.core_milli]
                total[s.uuid].exclusive |= s.exclusive
                total[s.uuid].holders.add(a.id)
        for uuid in app.keys() | init.keys():
            total[uuid].mem_mib += max(app[uuid][0], init[uuid][0])
            total[uuid].core_milli += max(app[uuid][1], init[uuid][1])
    return total


def assert_within_capacity(state: NodeLedger) -> None:
    for uuid, load in loads(state).items():
        c = state.node.card(uuid)
        assert c is not None, f"an allocation holds {uuid}, which is not on the node"
        assert load.mem_mib <= c.memory_mib, f"card {c.index} over memory: {load}"
        assert load.core_milli <= CORE_WHOLE, f"card {c.index} over compute: {load}"
        if load.exclusive:
            assert len(load.holders) == 1, f"card {c.index} is exclusive with holders {load.holders}"


# ---- replaying events -----------------------------------------------------------------------


@dataclass
class Replayed:
    inventory: Node | None = None
    live: dict[AllocationId, Allocation] = field(default_factory=dict)

    def empty(self) -> bool:
        return self.inventory is None and not self.live

    def apply(self, event: LedgerEvent) -> None:
        if event.kind is EventKind.NODE:
            self.inventory = event.inventory
        elif event.kind is EventKind.NODE_REMOVED:
            self.inventory, self.live = None, {}
        else:
            assert event.allocation is not None
            if event.kind is EventKind.RELEASED:
                self.live.pop(event.allocation.id, None)
            else:
                self.live[event.allocation.id] = event.allocation


def through_the_wire(event: LedgerEvent) -> LedgerEvent:
    return codec.event_from(json.loads(json.dumps(codec.event_to(event))))


# ---- the properties -------------------------------------------------------------------------


@PROPERTY
@given(SCENARIOS)
def test_no_card_is_ever_over_capacity(scenario: Scenario) -> None:
    for state in run(*scenario).states:
        assert_within_capacity(state)


@PROPERTY
@given(SCENARIOS, st.floats(0, 1000))
def test_release_is_idempotent(scenario: Scenario, later: float) -> None:
    final = run(*scenario).states[-1]
    for a in final.allocations:
        once = release(final, a.id, later, reason="first")
        assert release(once, a.id, later + 1, reason="again") is once
        if not a.live:
            assert once is final
        gone = once.get(a.id)
        assert gone is not None
        assert gone.state is AllocState.RELEASED
        assert [b for b in once.allocations if b.id != a.id] == [b for b in final.allocations if b.id != a.id]


@PROPERTY
@given(SCENARIOS)
def test_replaying_the_events_rebuilds_the_live_allocations(
    scenario: Scenario,
) -> None:
    states = run(*scenario).states
    replayed = Replayed()
    previous: NodeLedger | None = None
    for revision, state in enumerate(states, start=1):
        for event in diff(previous, state, revision):
            replayed.apply(through_the_wire(event))
        previous = state
    final = states[-1]
    assert replayed.inventory == final.node
    assert replayed.live == {a.id: a for a in final.live()}
    for event in diff(final, None, len(states) + 1):
        replayed.apply(event)
    assert replayed.empty()


@PROPERTY
@given(SCENARIOS)
def test_every_ledger_survives_the_codec(scenario: Scenario) -> None:
    for state in run(*scenario).states:
        assert codec.ledger_from(json.loads(json.dumps(codec.ledger_to(state)))) == state


@PROPERTY
@given(SCENARIOS, st.floats(0, 5000))
def test_tidy_keeps_every_live_allocation_and_expires_only_due_leases(scenario: Scenario, now: float) -> None:
    final = run(*scenario).states[-1]
    tidied = tidy(final, now)
    for a in final.live():
        after = tidied.get(a.id)
        assert after is not None
        due = a.state is AllocState.RESERVED and a.lease_expires_at is not None and a.lease_expires_at <= now
        assert after.live is not due
        if due:
            assert after.reason == "lease expired"
    assert_within_capacity(tidied)


DENSE = st.builds(
    Request,
    count=st.integers(1, 2),
    mem_mib=st.none() | st.sampled_from([500, 1000, 3000, 6000]),
    core_milli=st.none() | st.sampled_from([200, 300, 500, 700]),
)


@PROPERTY
@given(NODES.map(lambda n: replace(n, cards=n.cards[:3])), st.lists(DENSE, min_size=1, max_size=12))
def test_fit_and_reserve_agree_on_crowded_cards(node: Node, wanted: list[Request]) -> None:
    """Each request in turn: where fit refuses, reserve refuses; what fit places, reserve takes."""
    steps: list[tuple[float, Op]] = [(1.0, Reserve((ContainerAsk("main", q),), None)) for q in wanted]
    final = run(node, steps).states[-1]
    assert_within_capacity(final)
