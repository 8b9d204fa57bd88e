"""The share audit: each holder's use of a card against its grant, and what nobody accounts for."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings

from gpuledger_core import codec, codec_status
from gpuledger_core.card_usage import ProcessUse, Usage, usage_of
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import reserve
from gpuledger_core.model import AllocState, Grant, Owner, OwnerKind
from gpuledger_core.status import Holder, NodeStatus, audit, node_status

from .builders import allocation, card, ledger, share, uuid_of, whole
from .strategies import node_statuses

pytestmark = pytest.mark.timeout(5)


def holder(uid: str, mem_mib: int, *, kind: OwnerKind = OwnerKind.POD, exclusive: bool = False,
           container: str = "main") -> Holder:  # fmt: skip
    owner = Owner(kind, uid, "ns", f"name-{uid}")
    return Holder(
        AllocationId(f"a-{uid}-{container}"), owner, container, mem_mib, 100, exclusive, AllocState.BOUND, 1.0
    )


def used(*rows: tuple[str | None, int]) -> Usage:
    processes = tuple(ProcessUse(mib, pod) for pod, mib in rows)
    return Usage(len(processes), sum(mib for _, mib in rows), processes)


def measured(holders: tuple[Holder, ...]) -> list[tuple[str, int | None, bool]]:
    return [(h.owner.id, h.used_mib, h.over) for h in holders]


# name: (holders, usage) -> (each holder's (uid, used, over), foreign processes, foreign MiB)
CASES = {
    "two shares within their grants": (
        [holder("p", 4000), holder("q", 2000)],
        used(("p", 3000), ("q", 2000)),
        ([("p", 3000, False), ("q", 2000, False)], 0, 0),
    ),
    "one share over, its neighbour's room is not lent to it": (
        [holder("p", 4000), holder("q", 2000)],
        used(("p", 1000), ("q", 2500)),
        ([("p", 1000, False), ("q", 2500, True)], 0, 0),
    ),
    "a holder's processes add up": (
        [holder("p", 4000)],
        used(("p", 2500), ("p", 2000)),
        ([("p", 4500, True)], 0, 0),
    ),
    "a holder with no process uses nothing": ([holder("p", 4000)], used(), ([("p", 0, False)], 0, 0)),
    "a whole-card holder is never over": (
        [holder("p", 8000, exclusive=True)],
        used(("p", 9000)),
        ([("p", 9000, False)], 0, 0),
    ),
    "a process in no pod is foreign, even on a card held whole": (
        [holder("p", 8000, exclusive=True)],
        used(("p", 1000), (None, 300)),
        ([("p", 1000, False)], 1, 300),
    ),
    "another pod's process is foreign": (
        [holder("p", 4000)],
        used(("p", 1000), ("stranger", 700), ("stranger", 100)),
        ([("p", 1000, False)], 2, 800),
    ),
    "nobody holds the card: every process is foreign": ([], used(("x", 100), (None, 50)), ([], 2, 150)),
    "two containers of one pod are measured together": (
        [holder("p", 3000, container="a"), holder("p", 1000, container="b")],
        used(("p", 3500)),
        ([("p", 3500, False), ("p", 3500, False)], 0, 0),
    ),
    "two containers of one pod, together over": (
        [holder("p", 3000, container="a"), holder("p", 1000, container="b")],
        used(("p", 4100)),
        ([("p", 4100, True), ("p", 4100, True)], 0, 0),
    ),
    "a tool's use (no pod) within its grant is not foreign": (
        [holder("t", 2000, kind=OwnerKind.TOOL), holder("p", 2000)],
        used((None, 1500), ("p", 500)),
        ([("t", None, False), ("p", 500, False)], 0, 0),
    ),
    "a tool's use beyond its grant is foreign, as before the audit": (
        [holder("t", 2000, kind=OwnerKind.TOOL)],
        used((None, 2600)),
        ([("t", None, False)], 1, 600),
    ),
    "a claim's pod is not named by the ledger: judged against the claim's grant": (
        [holder("claim-uid", 4000, kind=OwnerKind.CLAIM)],
        used(("the-claims-pod", 3000)),
        ([("claim-uid", None, False)], 0, 0),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_audit(name: str) -> None:
    holders, usage, (expected, processes, mib) = CASES[name]
    found, foreign_processes, foreign_mib = audit(holders, usage)
    assert (measured(found), foreign_processes, foreign_mib) == (expected, processes, mib)


def test_without_attribution_the_heuristic_stands_and_nobody_is_measured() -> None:
    holders = [holder("p", 4000), holder("q", 2000)]
    found, processes, mib = audit(holders, Usage(3, 6500))
    assert found == tuple(holders)
    assert (processes, mib) == (1, 500)
    assert audit([holder("p", 8000, exclusive=True)], Usage(2, 9000))[1:] == (0, 0)
    assert audit([], Usage(2, 300))[1:] == (2, 300)


def test_node_status_carries_each_holders_use() -> None:
    state = reserve(ledger(8000, 8000), allocation("a", Grant("main", (share(0, 3000, 250),))))
    state = reserve(state, allocation("b", Grant("main", (whole(card(1)),))))
    usage: dict[str, Usage] = {uuid_of(0): used(("uid-a", 3500), (None, 10)), uuid_of(1): used(("uid-b", 100))}
    status = node_status(state, usage=usage)
    (a,) = status.cards[0].holders
    (b,) = status.cards[1].holders
    assert (a.used_mib, a.over, b.used_mib, b.over) == (3500, True, 100, False)
    assert (status.cards[0].foreign_processes, status.cards[0].foreign_mib, status.cards[0].processes) == (1, 10, 2)
    assert node_status(state).cards[0].holders[0] == replace(a, used_mib=None, over=False)


def test_usage_from_an_inventory_that_attributes() -> None:
    extra = {
        "cards": [
            {"uuid": "GPU-a", "processes": [
                {"pid": 1, "used_mib": 100, "mig_uuid": None, "pod_uid": "p", "container_id": "c"},
                {"pid": 2, "used_mib": None, "mig_uuid": None, "pod_uid": None, "container_id": None},
            ]},
            {"uuid": "GPU-b", "processes": []},
        ]
    }  # fmt: skip
    assert usage_of(extra) == {
        "GPU-a": Usage(2, 100, (ProcessUse(100, "p", "c"), ProcessUse(0))),
        "GPU-b": Usage(0, 0, None),
    }


def test_usage_from_an_inventory_before_the_audit() -> None:
    extra = {"cards": [{"uuid": "GPU-a", "processes": [{"pid": 1, "used_mib": 100, "mig_uuid": None}]}]}
    assert usage_of(extra) == {"GPU-a": Usage(1, 100, None)}


@pytest.mark.parametrize(
    "extra",
    [None, [], {"cards": "x"}, {"cards": [1, {"uuid": 3}, {"uuid": "GPU-a", "processes": {}}]}],
)
def test_malformed_usage_is_none(extra: object) -> None:
    assert usage_of(extra) == {}


def test_malformed_process_fields_are_not_trusted() -> None:
    extra = {"cards": [{"uuid": "GPU-a", "processes": [{"used_mib": "9", "pod_uid": 7, "container_id": 1}, 5]}]}
    assert usage_of(extra) == {"GPU-a": Usage(2, 0, (ProcessUse(0),))}


@settings(max_examples=200, deadline=None)
@given(status=node_statuses)
def test_the_dashboards_json_carries_use_and_the_mark(status: NodeStatus) -> None:
    assert codec_status.node_status_from(json.loads(json.dumps(codec_status.node_status_to(status)))) == status


def test_the_dashboards_json_from_an_allocator_before_the_audit_reads_as_not_measured() -> None:
    raw = codec_status.holder_to(holder("p", 100))
    del raw["used_mib"], raw["over"]
    assert codec_status.holder_from(codec.Reader(raw)) == holder("p", 100)


def test_each_pod_holder_s_share_of_the_sm_time_is_shown_and_never_judged() -> None:
    holders = [holder("p", 4000), holder("q", 2000), holder("t", 1000, kind=OwnerKind.TOOL)]
    sampled = (ProcessUse(1000, "p", sm_percent=30), ProcessUse(500, "p", sm_percent=45),
               ProcessUse(100, None, sm_percent=20), ProcessUse(1900, "q", sm_percent=None))  # fmt: skip
    found, _, _ = audit(holders, Usage(4, 3500, sampled))
    assert [(h.owner.id, h.used_core_milli, h.over) for h in found] == [
        ("p", 750, False),
        ("q", 0, False),
        ("t", None, False),
    ]
    unsampled = tuple(replace(p, sm_percent=None) for p in sampled)
    found, _, _ = audit(holders, Usage(4, 3500, unsampled))
    assert [h.used_core_milli for h in found] == [None, None, None]


def test_sm_percent_is_read_from_the_inventory_and_bounded() -> None:
    rows = [{"pid": 1, "used_mib": 10, "pod_uid": "p", "sm_percent": 35}, {"pid": 2, "pod_uid": "p", "sm_percent": 250},
            {"pid": 3, "pod_uid": "p", "sm_percent": -1}, {"pid": 4, "pod_uid": "p", "sm_percent": "9"}]  # fmt: skip
    found = usage_of({"cards": [{"uuid": "GPU-a", "processes": rows}]})["GPU-a"]
    assert found.attributed is not None and [p.sm_percent for p in found.attributed] == [35, 100, None, None]
