"""The reconciler's decisions: what a pod listing releases and what it rebuilds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger_allocator.repairs import (
    POD_DELETED,
    POD_FINISHED,
    POD_HOLDS_ANOTHER,
    Listing,
    PodSeen,
    reconciled,
    release_reason,
)
from gpuledger_core.ids import AllocationId, PodUid
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, AllocState, Grant, Owner, OwnerKind
from tests.unit.core.builders import NODE, allocation, ledger, share

NOW = 1000.0
GRACE = 30.0


def held(allocation_id: str, *, created_at: float = 0.0, **kw: object) -> Allocation:
    return allocation(allocation_id, Grant("main", (share(0, 1000),)), created_at=created_at, **kw)  # type: ignore[arg-type]


def pod_of(a: Allocation, phase: str = "Running", *, node: str = NODE, annotated: bool = False) -> PodSeen:
    return PodSeen(PodUid(a.owner.id), a.owner.namespace, a.owner.name, phase, node, a if annotated else None)


def listing(*pods: PodSeen, started_at: float = NOW) -> Listing:
    return Listing.of(pods, started_at)


OLD = held("old", created_at=NOW - 60)
YOUNG = held("young", created_at=NOW - 5)


@pytest.mark.parametrize(
    ("case", "alloc", "pods", "reason"),
    [
        ("pod running", OLD, [pod_of(OLD)], ""),
        ("pod pending", OLD, [pod_of(OLD, "Pending")], ""),
        ("pod unknown", OLD, [pod_of(OLD, "Unknown")], ""),
        ("pod deleted", OLD, [], POD_DELETED),
        ("pod succeeded", OLD, [pod_of(OLD, "Succeeded")], POD_FINISHED),
        ("pod failed", OLD, [pod_of(OLD, "Failed")], POD_FINISHED),
        ("young allocation, pod not listed yet", YOUNG, [], ""),
        ("young allocation, pod finished", YOUNG, [pod_of(YOUNG, "Failed")], POD_FINISHED),
        ("exactly the grace old", held("edge", created_at=NOW - GRACE), [], POD_DELETED),
        ("bound allocation", replace(OLD, state=AllocState.BOUND), [], POD_DELETED),
        ("already released", replace(OLD, state=AllocState.RELEASED), [], ""),
        ("owned by a tool", replace(OLD, owner=Owner(OwnerKind.TOOL, "uid-old")), [], ""),
        ("bound pod holds this one", OLD, [pod_of(OLD, annotated=True)], ""),
        ("bound pod holds another", OLD, [replace(pod_of(OLD), allocation=replace(OLD, id=AllocationId("new")))],
         POD_HOLDS_ANOTHER),
        ("unbound pod's reservation", OLD, [replace(pod_of(OLD, "Pending", node=""), allocation=None)], ""),
    ],
)
def test_release_reason(case: str, alloc: Allocation, pods: list[PodSeen], reason: str) -> None:
    assert release_reason(alloc, listing(*pods), GRACE) == reason, case


def test_releases_keep_others_and_report_reasons() -> None:
    gone, done, kept = held("gone", created_at=1.0), held("done", created_at=1.0), held("kept", created_at=1.0)
    start = NodeLedger(ledger(8000).node, (gone, done, kept))
    out = reconciled(start, listing(pod_of(done, "Succeeded"), pod_of(kept)), GRACE, NOW)
    assert dict(out.released) == {gone.id: POD_DELETED, done.id: POD_FINISHED}
    states = {a.id: (a.state, a.reason) for a in out.ledger.allocations}
    assert states[gone.id] == (AllocState.RELEASED, POD_DELETED)
    assert states[done.id] == (AllocState.RELEASED, POD_FINISHED)
    assert states[kept.id][0] is AllocState.RESERVED
    assert out.rebuilt == () and out.conflicts == ()


def test_nothing_to_do_changes_nothing() -> None:
    start = reserve(ledger(8000), OLD)
    out = reconciled(start, listing(pod_of(OLD)), GRACE, NOW)
    assert out.ledger == start and not (out.released or out.rebuilt or out.conflicts)


# --- rebuild ---

LOST = held("lost", created_at=NOW - 600, lease=NOW - 300)  # the annotation: reserved, lease long over
LEASED = replace(LOST, lease_expires_at=NOW + 60)


def test_rebuild_puts_the_allocation_back_bound() -> None:
    out = reconciled(ledger(8000), listing(pod_of(LOST, annotated=True)), GRACE, NOW)
    assert out.rebuilt == (LOST.id,) and out.conflicts == ()
    back = out.ledger.get(LOST.id)
    assert back is not None
    assert back.state is AllocState.BOUND and back.lease_expires_at is None
    assert back.grants == LOST.grants and back.owner == LOST.owner and back.created_at == LOST.created_at


def test_rebuild_keeps_device_ids() -> None:
    with_ids = replace(LOST, grants=(Grant("main", (share(0, 1000),), device_ids=("GPU-0000::3",)),))
    out = reconciled(ledger(8000), listing(pod_of(with_ids, annotated=True)), GRACE, NOW)
    back = out.ledger.get(with_ids.id)
    assert back is not None and back.grants[0].device_ids == ("GPU-0000::3",)


@pytest.mark.parametrize(
    ("case", "pod", "rebuilt"),
    [
        ("running", pod_of(LOST, "Running", annotated=True), True),
        ("pending, lease still running", pod_of(LEASED, "Pending", annotated=True), True),
        ("pending, lease over: maybe never admitted", pod_of(LOST, "Pending", annotated=True), False),
        ("finished", pod_of(LOST, "Succeeded", annotated=True), False),
        ("on another node", pod_of(LOST, node="node-b", annotated=True), False),
        ("not bound to a node", pod_of(LOST, node="", annotated=True), False),
        ("no annotation", pod_of(LOST), False),
    ],
)
def test_rebuild_only_pods_holding_cards_on_the_node(case: str, pod: PodSeen, rebuilt: bool) -> None:
    out = reconciled(ledger(8000), listing(pod), GRACE, NOW)
    assert bool(out.rebuilt) is rebuilt, case
    assert out.conflicts == ()


def test_rebuild_that_does_not_fit_is_a_conflict() -> None:
    big = held("big", created_at=1.0)
    full = reserve(ledger(1500), replace(big, grants=(Grant("main", (share(0, 1000),)),)))
    out = reconciled(full, listing(pod_of(big), pod_of(LOST, annotated=True)), GRACE, NOW)
    assert out.rebuilt == () and [a for a, _ in out.conflicts] == [LOST.id]
    assert "MiB free" in out.conflicts[0][1]
    assert out.ledger == full


def test_rebuild_of_a_card_not_on_the_node_is_a_conflict() -> None:
    elsewhere = replace(LOST, grants=(Grant("main", (share(5, 1000),)),))
    out = reconciled(ledger(8000), listing(pod_of(elsewhere, annotated=True)), GRACE, NOW)
    assert out.rebuilt == () and "not on node" in out.conflicts[0][1]


def test_rebuild_never_overwrites_a_live_allocation() -> None:
    live = replace(LOST, state=AllocState.BOUND, grants=(Grant("main", (share(0, 2000),)),))
    start = reserve(ledger(8000), live)
    out = reconciled(start, listing(pod_of(LOST, annotated=True)), GRACE, NOW)
    assert out.ledger == start and out.rebuilt == () and out.conflicts == ()


def test_rebuild_never_revives_a_released_allocation() -> None:
    start = NodeLedger(ledger(8000).node, (replace(LOST, state=AllocState.RELEASED),))
    out = reconciled(start, listing(pod_of(LOST, annotated=True)), GRACE, NOW)
    assert out.ledger == start and out.rebuilt == ()


def test_a_bound_pods_stray_allocation_is_released_and_its_annotated_one_rebuilt() -> None:
    """The Binding writes the node and the annotation together: a bound pod's annotation names the
    allocation it holds, and another live one of the same pod is a leftover of a failed attempt."""
    other = replace(held("other", created_at=1.0), owner=LOST.owner)
    start = reserve(ledger(8000), other)
    out = reconciled(start, listing(pod_of(LOST, annotated=True)), GRACE, NOW)
    assert out.released == ((other.id, POD_HOLDS_ANOTHER),)
    assert out.rebuilt == (LOST.id,)
    assert [a.id for a in out.ledger.live()] == [LOST.id]


def test_rebuild_of_another_pods_allocation_is_a_conflict() -> None:
    impostor = replace(pod_of(LOST, annotated=True), uid=PodUid("someone-else"))
    out = reconciled(ledger(8000), listing(impostor), GRACE, NOW)
    assert out.rebuilt == () and "carries the allocation" in out.conflicts[0][1]


def test_release_makes_room_for_a_rebuild_in_the_same_round() -> None:
    gone = held("gone", created_at=1.0)
    full = reserve(ledger(1500), gone)
    out = reconciled(full, listing(pod_of(LOST, annotated=True)), GRACE, NOW)
    assert out.released == ((gone.id, POD_DELETED),) and out.rebuilt == (LOST.id,)
