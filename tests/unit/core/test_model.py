from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import CardUuid
from gpuledger_core.model import Link, Owner, OwnerKind, PcieLevel, Request

from .builders import node


@pytest.mark.parametrize(
    ("count", "mem_mib", "core_milli", "field", "problem"),
    [
        (0, None, None, "gpu", "must be 1..64 cards, got 0"),
        (65, None, None, "gpu", "must be 1..64 cards, got 65"),
        (-1, None, None, "gpu", "must be 1..64 cards, got -1"),
        (1, 0, None, "gpu-mem", "must be a positive number of MiB, got 0"),
        (1, -512, None, "gpu-mem", "must be a positive number of MiB, got -512"),
        (1, None, 0, "gpu-core", "must be 1..100 percent, got 0"),
        (1, None, 1001, "gpu-core", "must be 1..100 percent, got 100.1"),
        (1, 1, -5, "gpu-core", "must be 1..100 percent, got -0.5"),
    ],
)
def test_a_bad_request_names_its_field(
    count: int, mem_mib: int | None, core_milli: int | None, field: str, problem: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Request(count, mem_mib, core_milli)
    assert (caught.value.field, caught.value.problem) == (field, problem)
    assert str(caught.value) == f"{field}: {problem}"


@pytest.mark.parametrize(
    ("count", "mem_mib", "core_milli"),
    [(1, None, None), (64, None, None), (1, 1, None), (1, None, 1), (1, None, 1000), (3, 4096, 250)],
)
def test_requests_at_the_limits_are_accepted(count: int, mem_mib: int | None, core_milli: int | None) -> None:
    made = Request(count, mem_mib, core_milli)
    assert (made.count, made.mem_mib, made.core_milli) == (count, mem_mib, core_milli)


@pytest.mark.parametrize(
    ("request_", "exclusive"),
    [
        (Request(), True),
        (Request(count=4), True),
        (Request(mem_mib=1024), False),
        (Request(core_milli=300), False),
    ],
)
def test_a_request_without_a_share_is_exclusive(request_: Request, exclusive: bool) -> None:
    assert request_.exclusive is exclusive


def test_a_model_selector_allows_only_its_models() -> None:
    anything = Request()
    picky = Request(models=frozenset({"Tesla P4", "Tesla T4"}))
    assert anything.allows("Tesla V100")
    assert picky.allows("Tesla T4")
    assert not picky.allows("Tesla V100")


def test_an_owner_needs_an_id() -> None:
    with pytest.raises(InvalidArgument) as caught:
        Owner(OwnerKind.TOOL, "")
    assert caught.value.field == "id"


@pytest.mark.parametrize(
    ("owner", "key", "description"),
    [
        (Owner(OwnerKind.POD, "u1", "ml", "trainer"), "pod:u1", "pod ml/trainer"),
        (Owner(OwnerKind.POD, "u1"), "pod:u1", "pod u1"),
        (Owner(OwnerKind.TOOL, "bench-7"), "tool:bench-7", "tool bench-7"),
    ],
)
def test_owner_key_and_description(owner: Owner, key: str, description: str) -> None:
    assert owner.key == key
    assert owner.describe() == description


def test_a_missing_link_defaults_to_no_nvlink_over_the_system() -> None:
    assert node(1, 1, 1).link(2, 0) == Link(0, 2, 0, PcieLevel.SYSTEM)


def test_a_link_is_found_whichever_way_round_it_is_asked() -> None:
    known = Link(0, 1, 4, PcieLevel.SINGLE_SWITCH)
    base = node(1, 1)
    joined = replace(base, links=(known,))
    assert joined.link(0, 1) is known
    assert joined.link(1, 0) is known


def test_a_card_is_found_by_uuid() -> None:
    n = node(100, 200)
    assert n.card(n.cards[1].uuid) is n.cards[1]
    assert n.card(CardUuid("GPU-missing")) is None
