"""Pods filter has placed but not bound yet: the bookkeeping, and every verb counting them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Grant, Owner, OwnerKind, Request
from gpuledger_core.pods import PodAsk, reserve_pod
from gpuledger_placement.app import Parts
from gpuledger_placement.assumed import Assumptions

from .fleet import parts

pytestmark = pytest.mark.timeout(10)
NODES = ("rtx-0", "p4-0", "h100-0", "a100-0")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def owner(n: int) -> Owner:
    return Owner(OwnerKind.POD, f"uid-{n}", "ns", f"p{n}")


def pod(n: int, request: Request | None = None) -> PodAsk:
    return PodAsk(owner(n), (ContainerAsk("c", request or Request(1)),))


def held(n: int, node: str = "p4-0") -> Allocation:
    return Allocation(AllocationId(f"assumed-{n}"), owner(n), NodeName(node), (Grant("c", ()),))


def events(event: str) -> float:
    return REGISTRY.get_sample_value("gpuledger_placement_assumptions_total", {"event": event}) or 0.0


def with_clock(built: Parts) -> Clock:
    clock = Clock()
    built.service.assumed = Assumptions(30.0, clock)
    return clock


# --- the bookkeeping ---


def test_an_assumption_is_replaced_by_the_same_pods_next_and_ends_once() -> None:
    assumed = Assumptions(30.0, Clock())
    made, replaced = events("made"), events("refiltered")
    assumed.assume(held(1, "p4-0"), PodAsk(owner(1)))
    generation = assumed.generation("p4-0")
    assumed.assume(held(1, "h100-0"), PodAsk(owner(1)))
    assert (events("made"), events("refiltered")) == (made + 2, replaced + 1)
    assert assumed.pods_on("p4-0") == 0 and assumed.pods_on("h100-0") == 1 and len(assumed) == 1
    assert assumed.generation("p4-0") > generation  # p4-0's answers are stale now
    bound = events("bound")
    assert assumed.forget(owner(1), "bound") is not None
    assert assumed.forget(owner(1), "bound") is None
    assert events("bound") == bound + 1 and len(assumed) == 0


def test_assumptions_expire_oldest_first_after_the_ttl() -> None:
    clock = Clock()
    assumed = Assumptions(30.0, clock)
    assumed.assume(held(1), PodAsk(owner(1)))
    clock.now += 20
    assumed.assume(held(2), PodAsk(owner(2)))
    clock.now += 10
    expired = events("expired")
    assert assumed.expire() == 1
    assert assumed.of(owner(1)) is None and assumed.of(owner(2)) is not None
    clock.now += 19.9
    assert assumed.expire() == 0
    clock.now += 0.1
    assert assumed.expire() == 1 and events("expired") == expired + 2


@pytest.mark.parametrize(
    ("filtered_by", "bound_by", "taken"),
    [
        ("gpuledger-scheduler", "gpuledger-scheduler", True),
        ("capacity-planner", "gpuledger-scheduler", False),  # another caller's copy of the pod
        ("", "", False),  # plain HTTP: nobody is identified, the pod is read afresh
        ("gpuledger-scheduler", "", False),
    ],
)
def test_only_the_identified_caller_whose_filter_sent_the_pod_takes_its_copy(
    filtered_by: str, bound_by: str, taken: bool
) -> None:
    assumed = Assumptions(30.0, Clock())
    made = assumed.assume(held(1), PodAsk(owner(1)), filtered_by)
    assert made.caller == filtered_by
    assert made.taken_by(bound_by) is taken


def test_filter_records_its_caller_in_the_assumption() -> None:
    built = parts()
    assert built.service.filter(pod(1), NODES, "gpuledger-scheduler").fits
    found = built.service.assumed.of(owner(1))
    assert found is not None and found.caller == "gpuledger-scheduler"


def test_an_assumption_ends_when_the_ledger_holds_the_pod() -> None:
    assumed = Assumptions(30.0, Clock())
    assumed.assume(held(1), PodAsk(owner(1)))
    assumed.assume(held(2), PodAsk(owner(2)))
    built = parts()
    entry = built.view.entry("p4-0")
    assert entry is not None
    ledger = NodeLedger(entry.ledger.node, (replace(held(1), id=AllocationId("a-real")),))
    written = events("written")
    assert [a.owner for a in assumed.on("p4-0", ledger)] == [owner(2)]
    assert events("written") == written + 1


# --- the verbs ---


def test_filter_answers_the_one_node_it_chose_and_assumes_the_pod_there() -> None:
    built = parts("binpack")
    found = built.service.filter(pod(1), NODES)
    assert found.fits == ("rtx-0",)  # binpack: the fullest node after placing
    assert set(found.passed_over) == {"p4-0", "h100-0", "a100-0"}
    assert found.failed == {} and found.unresolvable == {}
    assumption = built.service.assumed.of(owner(1))
    assert assumption is not None and assumption.node == "rtx-0"
    [grant] = assumption.allocation.grants
    assert [s.index for s in grant.cards] == [0] and len(grant.device_ids) == 1
    # rtx-0's only card is spoken for: the next pod goes elsewhere, and nothing fits rtx-0 now.
    assert built.service.filter(pod(2), NODES).fits == ("p4-0",)
    assert built.service.judge(pod(3), ["rtx-0"]).failed == {
        "rtx-0": "0 free whole card(s) of the 1 needed (counting 1 pod(s) placed here, being bound)"
    }


def test_a_pod_filtered_again_is_not_in_its_own_way() -> None:
    built = parts()
    both = pod(1, Request(2))
    assert built.service.filter(both, ["p4-0"]).fits == ("p4-0",)
    assert built.service.filter(both, ["p4-0"]).fits == ("p4-0",)  # a retry: its earlier choice is replaced
    assert built.service.assumed.pods_on("p4-0") == 1
    assert built.service.filter(pod(2, Request(2)), ["p4-0"]).fits == ()


def test_an_expired_assumption_frees_the_room_and_no_cached_answer_hides_it() -> None:
    built = parts()
    clock = with_clock(built)
    assert built.service.filter(pod(1, Request(2)), ["p4-0"]).fits == ("p4-0",)
    assert "counting 1 pod(s)" in built.service.filter(pod(2, Request(2)), ["p4-0"]).failed["p4-0"]
    assert built.service.prioritize(pod(2, Request(2)), ["p4-0", "a100-0"]) == {"p4-0": 0, "a100-0": 10}
    clock.now += 30
    assert built.service.filter(pod(2, Request(2)), ["p4-0"]).fits == ("p4-0",)
    assert built.service.assumed.of(owner(1)) is None


def test_once_the_view_holds_the_pods_reservation_it_is_counted_once() -> None:
    built = parts()
    first = pod(1)
    assert built.service.filter(first, ["p4-0"]).fits == ("p4-0",)
    entry = built.view.entry("p4-0")
    assert entry is not None
    _, policy = built.service.policies.get("default")
    written = reserve_pod(entry.ledger, first, policy, AllocationId("a-1"), now=0, lease_s=60, slots_per_card=8)
    built.view.apply(NodeName("p4-0"), written, entry.revision + 1)
    # p4-0 has two cards: one held in the ledger, and the assumption is over, so one is free.
    assert built.service.filter(pod(2), ["p4-0"]).fits == ("p4-0",)
    assert built.service.assumed.of(owner(1)) is None
    assert built.service.filter(pod(3), ["p4-0"]).fits == ()


def test_place_for_a_tool_counts_the_pods_being_bound() -> None:
    built = parts("binpack")
    assert built.service.filter(pod(1), NODES).fits == ("rtx-0",)
    tool = PodAsk(Owner(OwnerKind.TOOL, "ci-1"), (ContainerAsk("", Request(1)),))
    placed = built.service.place(tool)
    assert placed.node == "p4-0" and "rtx-0" not in placed.ranked
    assert built.service.assumed.of(tool.owner) is None  # place reserves at once: nothing assumed


def test_a_pod_that_fits_nowhere_is_assumed_nowhere() -> None:
    built = parts()
    found = built.service.filter(pod(1, Request(9)), NODES)
    assert found.fits == () and len(found.unresolvable) == len(NODES)
    assert len(built.service.assumed) == 0
