from __future__ import annotations

import pytest

from gpuledger_core.model import AllocState, Grant, Isolation
from gpuledger_core.usage import CardFree, CardUse, allocation_use, free_of, node_use

from .builders import allocation, card, holding, share, uuid_of, whole

NONE = frozenset({Isolation.NONE})


def test_app_containers_on_one_card_add_up() -> None:
    pod = allocation("a", Grant("x", (share(0, 1000, 100),)), Grant("y", (share(0, 500, 50),)))
    assert allocation_use(pod) == {uuid_of(0): CardUse(1500, 150, False, 2, NONE)}


@pytest.mark.parametrize(
    ("inits", "apps", "expected_mem", "expected_core"),
    [
        # the biggest init share is larger than the apps' sum: it sets the hold
        ([(3000, 100), (2000, 600)], [(1000, 100), (500, 100)], 3000, 600),
        # the apps' sum is larger than any init share
        ([(1000, 100)], [(1000, 300), (1500, 300)], 2500, 600),
        # init only
        ([(700, 70)], [], 700, 70),
    ],
)
def test_an_init_container_counts_as_the_larger_of_itself_and_the_apps(
    inits: list[tuple[int, int]], apps: list[tuple[int, int]], expected_mem: int, expected_core: int
) -> None:
    grants = [Grant(f"init-{i}", (share(0, m, c),), init=True) for i, (m, c) in enumerate(inits)]
    grants += [Grant(f"app-{i}", (share(0, m, c),)) for i, (m, c) in enumerate(apps)]
    use = allocation_use(allocation("a", *grants))[uuid_of(0)]
    assert (use.mem_mib, use.core_milli) == (expected_mem, expected_core)


def test_an_init_container_on_another_card_holds_that_card_too() -> None:
    pod = allocation("a", Grant("init", (share(1, 900, 90),), init=True), Grant("app", (share(0, 100, 10),)))
    use = allocation_use(pod)
    assert use[uuid_of(0)].mem_mib == 100
    assert use[uuid_of(1)].mem_mib == 900


def test_node_use_sums_live_allocations_and_counts_holders() -> None:
    live = [holding("a", share(0, 1000, 100)), holding("b", share(0, 2000, 200), share(1, 10, 1))]
    gone = allocation("c", Grant("main", (share(0, 4000, 400),)), state=AllocState.RELEASED)
    use = node_use([*live, gone])
    assert use[uuid_of(0)] == CardUse(3000, 300, False, 2, NONE)
    assert use[uuid_of(1)] == CardUse(10, 1, False, 1, NONE)


def test_one_allocation_with_two_containers_on_a_card_is_one_holder() -> None:
    pod = allocation("a", Grant("x", (share(0, 1, 1),)), Grant("y", (share(0, 1, 1),)))
    assert node_use([pod])[uuid_of(0)].holders == 1


@pytest.mark.parametrize(
    ("use", "expected"),
    [
        (None, CardFree(8000, 1000, idle=True)),
        (CardUse(), CardFree(8000, 1000, idle=True)),
        (CardUse(3000, 250, False, 1), CardFree(5000, 750, idle=False)),
        (CardUse(9000, 1200, False, 3), CardFree(0, 0, idle=False)),
        (CardUse(8000, 1000, True, 1), CardFree(0, 0, idle=False)),
        # an exclusive hold leaves nothing, whatever it says it uses
        (CardUse(0, 0, True, 1), CardFree(0, 0, idle=False)),
    ],
)
def test_free_of(use: CardUse | None, expected: CardFree) -> None:
    assert free_of(card(0, 8000), use) == expected


def test_an_exclusive_share_makes_the_card_exclusive() -> None:
    c = card(0, 8000)
    use = node_use([holding("a", whole(c))])[c.uuid]
    assert use.exclusive
    assert free_of(c, use) == CardFree(0, 0, idle=False, tiers=NONE)


@pytest.mark.parametrize(
    ("mem", "core", "fits"),
    [(500, 500, True), (501, 500, False), (500, 501, False), (0, 0, True)],
)
def test_card_free_fits(mem: int, core: int, fits: bool) -> None:
    assert CardFree(500, 500, idle=False).fits(mem, core) is fits
