"""Placement's kept ranking: the same answer as a fresh look at every node, and a policy rebuild
that never rates the whole fleet within one request."""

from __future__ import annotations

from random import Random

import pytest

import gpuledger_placement.numbering as numbering
import gpuledger_placement.service as placement_service
from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, release
from gpuledger_core.model import Owner, OwnerKind, Request
from gpuledger_core.packing import rate
from gpuledger_core.pods import PodAsk, reserve_pod
from gpuledger_dev.fleet import parse_fleet
from gpuledger_placement.app import Parts, build
from gpuledger_placement.kube import NoPodApi
from gpuledger_placement.settings import PlacementSettings

PROFILES = ("h100-sxm-8", "a100-pcie-4", "tesla-p4-2", "rtx3090-1")
REQUESTS = (Request(1), Request(2), Request(4), Request(1, mem_mib=4000), Request(1, core_milli=300))


def fleet(count: int, policy: str) -> Parts:
    text = "nodes:\n" + "".join(f"  - name: n{i:03d}\n    profile: {PROFILES[i % 4]}\n" for i in range(count))
    built = build(PlacementSettings(kube="off", stale_after_s=0.0, policy=policy), None, NoPodApi(), None)
    for revision, node in enumerate(parse_fleet(text).nodes, start=1):
        built.view.apply(NodeName(node.node.name), NodeLedger(node.node), revision)
    return built


def pod(owner: str, *requests: Request) -> PodAsk:
    return PodAsk(Owner(OwnerKind.TOOL, owner), tuple(ContainerAsk(f"c{i}", r) for i, r in enumerate(requests)))


def fresh_look(built: Parts, ask: PodAsk, exclude: frozenset[str] = frozenset()) -> list[str]:
    """The ranking as every node rated afresh, then sorted, gives it."""
    service = built.service
    key, policy = service.policies.get(service.policy)
    service.drop_answers()
    names = [name for name in built.view.entries if name not in exclude]
    return service._ranked(service.resolve(ask), names, key, policy)


@pytest.mark.parametrize("policy", ["binpack", "spread", "bestfit", "default"])
def test_place_ranks_as_a_fresh_look_at_every_node_while_nodes_change(policy: str) -> None:
    rng = Random(7)
    built = fleet(24, policy)
    service, view = built.service, built.view
    for step in range(60):
        requests = (rng.choice(REQUESTS),) if step % 5 else (Request(1), Request(1))
        ask = pod(f"p{step}", *requests)
        exclude = frozenset(rng.sample(sorted(view.entries), rng.randrange(3)))
        try:
            placed = service.place(ask, exclude)
        except Exhausted:
            assert fresh_look(built, ask, exclude) == []
            continue
        ranked = list(placed.ranked)
        assert ranked == fresh_look(built, ask, exclude)
        entry = view.entries[placed.node]
        _, chosen = service.policies.get(policy)
        taken = reserve_pod(entry.ledger, ask, chosen, AllocationId(f"a-{step}"), now=0, lease_s=60, slots_per_card=8)
        if step % 7 == 3 and entry.ledger.allocations:  # now and then a node also frees something
            taken = release(taken, entry.ledger.allocations[0].id, 0, "done")
        view.apply(NodeName(placed.node), taken, entry.revision + 1)
        if step % 11 == 10:
            service.policies.refresh()  # a rebuilt policy: answers may come from the old one a while
            for _ in range(3):
                service.place(pod(f"warm-{step}", Request(1)))


def test_a_policy_rebuild_rates_a_slice_of_the_fleet_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement_service, "BUILD_STEP", 10)
    monkeypatch.setattr(numbering, "_content_of", lambda entry: entry.state.name)  # no two alike
    rated: list[str] = []

    def counting(state: object, *args: object, **kwargs: object) -> float | None:
        rated.append(getattr(state, "name", ""))
        return rate(state, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(placement_service, "rate", counting)
    built = fleet(35, "binpack")
    service = built.service
    one = Request(1)
    first = service.place(pod("first", one))
    assert len(rated) == 35  # the first question rates every node once
    rated.clear()
    assert service.place(pod("again", one)).ranked == first.ranked
    assert rated == []  # nothing changed: nothing is rated again

    service.policies.refresh()
    per_request = []
    for i in range(6):
        service.place(pod(f"after-{i}", one))
        per_request.append(len(rated))
        rated.clear()
    assert per_request == [10, 10, 10, 5, 0, 0]  # the new policy's ranking, a slice at a time


def test_a_policy_rebuild_built_between_requests_costs_no_request_a_rating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numbering, "_content_of", lambda entry: entry.state.name)  # no two alike
    rated: list[str] = []

    def counting(state: object, *args: object, **kwargs: object) -> float | None:
        rated.append(getattr(state, "name", ""))
        return rate(state, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(placement_service, "rate", counting)
    built = fleet(35, "default")
    service = built.service
    service.build_step = 0  # as the service's own loop runs it: ``build_rankings`` between requests
    one = Request(1)
    service.place(pod("first", one))
    assert service.build_rankings(10) is False  # nothing to build
    rated.clear()

    service.policies.refresh()
    service.place(pod("after", one))  # starts the new policy's ranking, answers from the old one
    assert rated == []
    slices = []
    while service.build_rankings(10):
        slices.append(len(rated))
        rated.clear()
    slices.append(len(rated))
    rated.clear()
    assert slices == [10, 10, 10, 5]
    placed = service.place(pod("built", one))
    assert rated == []  # the new ranking is in place: the request rates nothing
    assert list(placed.ranked) == fresh_look(built, pod("built", one))
