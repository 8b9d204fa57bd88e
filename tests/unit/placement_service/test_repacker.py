"""Defragmentation's limits in placement: which pods may be moved, how many a pod and an hour may
take, and the cool-down of a controller whose pod was moved."""

from __future__ import annotations

from typing import Any

from gpuledger_core.preemption import Holder
from gpuledger_placement.preemption_holders import holder_of
from gpuledger_placement.repacker import MOVABLE_LABEL, Defrag, controller_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bound(
    name: str, owner: str | None = "rs-1", movable: bool = True, priority: int = 0, **meta: Any
) -> dict[str, Any]:
    refs = [{"kind": "ReplicaSet", "name": "rs", "uid": owner, "controller": True}] if owner else []
    labels = {MOVABLE_LABEL: "true"} if movable else {}
    return {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "labels": labels,
                     "ownerReferences": refs, **meta},
        "spec": {"nodeName": "n1", "priority": priority},
        "status": {"startTime": "2026-12-01T00:00:00Z"},
    }  # fmt: skip


def holders(defrag: Defrag, pods: list[dict[str, Any]], priority: int = 5) -> set[str]:
    found, raws = defrag.movable(pods, priority, lambda p: holder_of(p, []))
    assert set(raws) == {key.removeprefix("pod:") for key in found}
    return set(found)


def test_only_labelled_bound_pods_a_controller_recreates_and_of_no_higher_priority_may_move() -> None:
    defrag = Defrag(clock=Clock())
    pods = [
        bound("ok"),
        bound("unlabelled", movable=False),
        bound("bare", owner=None),  # nothing would recreate it
        bound("going", deletionTimestamp="2026-12-01T00:00:05Z"),
        bound("higher", priority=6),
        bound("equal", priority=5),
    ]
    unbound = bound("unbound")
    unbound["spec"]["nodeName"] = ""
    not_controller = bound("owned")
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert holders(defrag, [*pods, unbound, not_controller]) == {"pod:uid-ok", "pod:uid-equal"}
    assert controller_of(bound("x", owner="rs-9")) == "rs-9" and controller_of(bound("y", owner=None)) is None


def test_a_pod_and_an_hour_take_at_most_their_moves_and_a_moved_controller_cools_down() -> None:
    clock = Clock()
    defrag = Defrag(max_moves=2, moves_per_hour=3, cooldown_s=600.0, clock=clock)
    assert defrag.budget() == 2
    defrag.moved([bound("a", owner="rs-1"), bound("b", owner="rs-2")])
    assert defrag.budget() == 1  # 3 an hour, 2 spent
    assert holders(defrag, [bound("c", owner="rs-1"), bound("d", owner="rs-3")]) == {"pod:uid-d"}  # rs-1 cools down
    defrag.moved([bound("d", owner="rs-3")])
    assert defrag.budget() == 0
    clock.now += 601
    assert holders(defrag, [bound("c", owner="rs-1")]) == {"pod:uid-c"}  # cooled down
    assert defrag.budget() == 0  # still within the hour
    clock.now += 3000
    assert defrag.budget() == 2


def test_a_budget_that_allows_no_disruption_marks_the_pod_protected() -> None:
    defrag = Defrag(clock=Clock())
    budget = {
        "metadata": {"namespace": "team", "name": "b"},
        "spec": {"selector": {}},
        "status": {"disruptionsAllowed": 0},
    }
    found, _ = defrag.movable([bound("ok")], 5, lambda p: holder_of(p, [budget]))
    assert found == {"pod:uid-ok": Holder(0, True, found["pod:uid-ok"].started_at)}
