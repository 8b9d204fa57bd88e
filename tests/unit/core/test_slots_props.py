"""Properties of slots over random sequences of pods and tools on one node: no card ever has more
holders than slots, and filter's verdict is what the reservation then does."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, release, reserve
from gpuledger_core.model import Allocation, Owner, OwnerKind, Request
from gpuledger_core.packing import from_ledger, make_policy
from gpuledger_core.packing.fit import problem
from gpuledger_core.pods import PodAsk, reserve_pod
from gpuledger_core.slots import card_of, slots_held

from .builders import NODE, ledger

pytestmark = pytest.mark.timeout(60)
PROPERTY = settings(max_examples=150, deadline=None)

shares = st.builds(
    Request,
    count=st.integers(1, 2),
    mem_mib=st.none() | st.sampled_from([100, 1000, 4000]),
    core_milli=st.sampled_from([None, 10, 100, 300]),
)
containers = st.lists(st.tuples(shares, st.booleans()), min_size=1, max_size=3)
steps = st.lists(
    st.tuples(st.sampled_from(["pod", "pod", "pod", "tool", "release"]), containers, st.integers(0, 50)),
    min_size=1,
    max_size=30,
)


def asks_of(drawn: list[tuple[Request, bool]]) -> tuple[ContainerAsk, ...]:
    asks = [ContainerAsk(f"c{n}", r, init) for n, (r, init) in enumerate(drawn)]
    return tuple(sorted(asks, key=lambda a: not a.init))  # init containers first, as pods list them


def check_holders(state: NodeLedger, slots: int) -> None:
    held = slots_held(state.allocations)
    assert all(n <= slots for n in held.values()), f"a card has more holders than {slots} slots: {held}"
    ids = Counter(i for a in state.live() for g in a.grants if not g.init for i in g.device_ids)
    assert all(n == 1 for n in ids.values()), "two app containers hold one device ID"
    for allocation in state.live():
        for grant in allocation.grants:
            assert [card_of(i) for i in grant.device_ids] == [s.uuid for s in grant.cards][: len(grant.device_ids)]


def step_pod(state: NodeLedger, asks: tuple[ContainerAsk, ...], n: int, slots: int, policy: str) -> NodeLedger:
    pod = PodAsk(Owner(OwnerKind.POD, f"uid-{n}", "ns", f"p{n}"), asks)
    single = pod.single()
    verdict = problem(from_ledger(state, slots_per_card=slots), single) if single is not None else None
    try:
        after = reserve_pod(
            state, pod, make_policy(policy), AllocationId(f"a-{n}"), now=0, lease_s=60, slots_per_card=slots
        )
    except Exhausted as err:
        assert verdict is None or verdict, f"filter said fits, the reservation said {err}"
        return state
    assert not verdict, f"filter said {verdict!r}, the reservation went through"
    return after


def step_tool(state: NodeLedger, asks: tuple[ContainerAsk, ...], n: int, slots: int) -> NodeLedger:
    try:
        grants = fit_node(state, asks, slots)
    except Exhausted:
        return state
    return reserve(state, Allocation(AllocationId(f"t-{n}"), Owner(OwnerKind.TOOL, f"tool-{n}"), NODE, grants))


@PROPERTY
@given(
    steps=steps,
    slots=st.integers(1, 4),
    policy=st.sampled_from(["bestfit", "default", "binpack", "spread"]),
    memories=st.sampled_from([(8000,), (8000, 8000), (8000, 16000, 16000)]),
)
def test_no_card_ever_has_more_holders_than_slots(
    steps: list[tuple[str, list[tuple[Request, bool]], int]], slots: int, policy: str, memories: tuple[int, ...]
) -> None:
    state = ledger(*memories)
    for n, (kind, drawn, pick) in enumerate(steps):
        if kind == "release":
            live = state.live()
            if live:
                state = release(state, live[pick % len(live)].id, now=1.0)
        elif kind == "tool":
            state = step_tool(state, asks_of(drawn), n, slots)
        else:
            state = step_pod(state, asks_of(drawn), n, slots, policy)
        check_holders(state, slots)
