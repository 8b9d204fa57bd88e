from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, fit_node, share_for
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import CORE_WHOLE, CardShare, Grant, Request

from .builders import NODE, card, holding, ledger, node, share, uuid_of


def _with_holds(memories: tuple[int, ...], holds: dict[int, tuple[int, int]]) -> NodeLedger:
    """A ledger whose card ``i`` is partly held by one allocation, ``holds[i] = (mem, core)``."""
    state = ledger(*memories)
    for index, (mem, core) in holds.items():
        state = reserve(state, holding(f"h{index}", share(index, mem, core)))
    return state


def _indexes(grants: tuple[Grant, ...]) -> list[list[int]]:
    return [[s.index for s in g.cards] for g in grants]


def _one(request: Request) -> list[ContainerAsk]:
    return [ContainerAsk("main", request)]


@pytest.mark.parametrize(
    ("holds", "request_", "chosen"),
    [
        # free memory 8000, 3000, 4000: the tightest card that fits wins
        ({1: (5000, 0), 2: (4000, 0)}, Request(mem_mib=2500), [1]),
        ({1: (5000, 0), 2: (4000, 0)}, Request(mem_mib=3500), [2]),
        ({1: (5000, 0), 2: (4000, 0)}, Request(mem_mib=3500, count=2), [2, 0]),
        # equal memory: the one with less compute free, then the lower index
        ({1: (1000, 500), 2: (1000, 100)}, Request(mem_mib=100), [1]),
        ({1: (1000, 100), 2: (1000, 100)}, Request(mem_mib=100), [1]),
        # compute-only request on full memory still fits
        ({0: (8000, 100)}, Request(core_milli=900), [0]),
        # exclusive: lowest free indexes, whatever is tighter
        ({0: (1, 1)}, Request(count=2), [1, 2]),
        ({}, Request(count=3), [0, 1, 2]),
    ],
)
def test_fit_node_chooses(holds: dict[int, tuple[int, int]], request_: Request, chosen: list[int]) -> None:
    state = _with_holds((8000, 8000, 8000), holds)
    assert _indexes(fit_node(state, _one(request_))) == [chosen]


def test_shares_are_what_was_asked_and_exclusive_takes_the_whole_card() -> None:
    c = card(0, 8000)
    assert share_for(c, Request(mem_mib=100)) == CardShare(c.uuid, 0, 100, 0)
    assert share_for(c, Request(core_milli=10)) == CardShare(c.uuid, 0, 0, 10)
    assert share_for(c, Request()) == CardShare(c.uuid, 0, 8000, CORE_WHOLE, exclusive=True)


def _mixed() -> NodeLedger:
    cards = (card(0, 8000, model="Tesla V100"), card(1, 7611, model="Tesla P4"))
    return NodeLedger(replace(node(), cards=cards))


def test_a_model_selector_picks_only_that_model() -> None:
    grants = fit_node(_mixed(), _one(Request(models=frozenset({"Tesla P4"}))))
    assert _indexes(grants) == [[1]]


def test_unhealthy_cards_are_never_chosen() -> None:
    cards = (card(0, 8000, healthy=False), card(1, 8000), card(2, 8000, healthy=False))
    state = NodeLedger(replace(node(), cards=cards))
    assert _indexes(fit_node(state, _one(Request()))) == [[1]]
    assert _indexes(fit_node(state, _one(Request(mem_mib=1)))) == [[1]]
    with pytest.raises(Exhausted, match="1 healthy card"):
        fit_node(state, _one(Request(count=2)))


@pytest.mark.parametrize(
    ("state", "request_", "reason"),
    [
        (
            _mixed(),
            Request(models=frozenset({"Tesla T4", "A10"})),
            "no card of model A10|Tesla T4 (has Tesla P4, Tesla V100)",
        ),
        (
            NodeLedger(replace(node(), cards=(card(0, healthy=False), card(1)))),
            Request(count=2),
            "1 healthy card(s) of the 2 needed",
        ),
        (_with_holds((8000, 8000), {0: (1, 1)}), Request(count=2), "1 free whole card(s) of the 2 needed"),
        (
            _with_holds((4000, 3000), {0: (3037, 0), 1: (2500, 0)}),
            Request(mem_mib=2560),
            "card 0 has 963 MiB free, 1597 MiB short of 2560 MiB",
        ),
        (
            _with_holds((8000, 8000), {0: (0, 700), 1: (0, 800)}),
            Request(core_milli=400),
            "card 0 has 30% compute free, 10% short of 40%",
        ),
        (
            _with_holds((8000, 8000, 8000), {0: (7000, 0), 1: (7000, 0)}),
            Request(mem_mib=2000, count=2),
            "1 card(s) with room of the 2 needed",
        ),
    ],
)
def test_why_a_request_does_not_fit(state: NodeLedger, request_: Request, reason: str) -> None:
    with pytest.raises(Exhausted) as caught:
        fit_node(state, _one(request_))
    assert str(caught.value) == f"{NODE}: {reason}"


def test_app_containers_of_one_owner_accumulate() -> None:
    state = ledger(8000, 8000)
    asks = [ContainerAsk(name, Request(mem_mib=5000)) for name in ("x", "y")]
    assert _indexes(fit_node(state, asks)) == [[0], [1]]
    with pytest.raises(Exhausted, match="card 0 has 3000 MiB free, 2000 MiB short of 5000 MiB"):
        fit_node(state, [*asks, ContainerAsk("z", Request(mem_mib=5000))])


def test_an_exclusive_container_does_not_take_a_card_a_sibling_shares() -> None:
    asks = [ContainerAsk("x", Request(mem_mib=10)), ContainerAsk("y", Request())]
    assert _indexes(fit_node(ledger(8000, 8000), asks)) == [[0], [1]]


def test_init_containers_do_not_accumulate_with_apps() -> None:
    asks = [
        ContainerAsk("init", Request(mem_mib=6000), init=True),
        ContainerAsk("app", Request(mem_mib=6000)),
    ]
    grants = fit_node(ledger(8000), asks)
    assert _indexes(grants) == [[0], [0]]
    assert [g.init for g in grants] == [True, False]
    # and what fit chose, the ledger accepts
    placed = reserve(ledger(8000), replace(holding("p"), grants=grants))
    assert placed.use()[uuid_of(0)].mem_mib == 6000


def test_fit_sees_what_the_ledger_already_holds() -> None:
    state = _with_holds((8000,), {0: (7000, 0)})
    with pytest.raises(Exhausted):
        fit_node(state, _one(Request(mem_mib=1001)))
    assert _indexes(fit_node(state, _one(Request(mem_mib=1000)))) == [[0]]
