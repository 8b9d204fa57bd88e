"""Pods over their grants: a Warning Event once per episode (once across replicas), and with action
evict an eviction after the grace, PodDisruptionBudgets respected with a back-off, never forced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpuledger_core.card_usage import ProcessUse, Usage
from gpuledger_core.errors import Conflict
from gpuledger_core.ids import AllocationId, CardUuid
from gpuledger_core.model import Allocation, AllocState, CardShare, Grant, Owner, OwnerKind
from gpuledger_placement.auditor import EVICTED, OVER, Auditor, over_grants
from gpuledger_placement.view import FleetView

from .test_drainer import NODE, Clock, FakeApi, fleet, pod

pytestmark = pytest.mark.timeout(5)
GRANT = 1024


class NamedEvents(FakeApi):
    """Events with a name are refused as a conflict the second time (as the API server does)."""

    async def create_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body.get("metadata", {}).get("name")
        if path.endswith("/events") and name and any(e["metadata"].get("name") == name for e in self.events):
            raise Conflict(f"events {name!r} already exists")
        return await super().create_object(path, body)


def holding(owner: Owner, index: int = 2, mem_mib: int = GRANT) -> Allocation:
    share = CardShare(CardUuid(f"GPU-{index}"), index, mem_mib, 100)
    return Allocation(AllocationId(f"a-{owner.id}"), owner, NODE, (Grant("c", (share,)),), AllocState.BOUND)


def usage(*rows: tuple[str, int], index: int = 2) -> dict[str, Usage]:
    processes = tuple(ProcessUse(mib, uid) for uid, mib in rows)
    return {f"GPU-{index}": Usage(len(processes), sum(mib for _, mib in rows), processes)}


def auditor(api: FakeApi, view: FleetView, clock: Clock, action: str = "report") -> Auditor:
    return Auditor(api, view, action, grace_s=60.0, clock=clock, first_backoff_s=5.0, max_backoff_s=20.0)


def counted(action: str) -> float:
    return REGISTRY.get_sample_value("gpuledger_placement_over_grant_actions_total", {"action": action}) or 0.0


def test_over_grants_names_the_pod_the_card_granted_and_used() -> None:
    view = fleet(None, holding(pod("hungry")), holding(pod("modest"), 2), holding(pod("elsewhere"), 3))
    ledger = view.entries[NODE].ledger
    (found,) = over_grants(ledger, usage(("uid-hungry", 1500), ("uid-modest", 1000), ("uid-elsewhere", 10)))
    assert (found.name, found.uuid, found.granted_mib, found.used_mib) == ("hungry", "GPU-2", GRANT, 1500)
    assert "uses 1500 MiB of card 2 (GPU-2) of node n1, granted 1024 MiB" in found.describe()
    claim = Owner(OwnerKind.CLAIM, "uid-claim", "team", "claim")
    assert over_grants(fleet(None, holding(claim)).entries[NODE].ledger, usage(("uid-pod", 9000))) == []


async def test_report_tells_the_pod_once_per_episode_and_evicts_nothing() -> None:
    api, clock = NamedEvents(), Clock()
    api.pod("hungry")
    view = fleet(None, holding(pod("hungry")))
    worker = auditor(api, view, clock)
    told = counted("told")
    worker.report(NODE, 10.0, usage(("uid-hungry", 1500)))
    for second in range(0, 120, 10):
        clock.now = 1000.0 + second
        await worker.sweep()
        worker.report(NODE, 10.0 + second, usage(("uid-hungry", 1600)))
    assert api.reasons() == [("Pod", "hungry", OVER)]
    (event,) = api.events
    assert event["type"] == "Warning"
    assert "uses 1500 MiB of card 2 (GPU-2) of node n1, granted 1024 MiB" in event["message"]
    assert api.evicted == []
    assert counted("told") - told == 1

    worker.report(NODE, 200.0, usage(("uid-hungry", 1000)))  # back within: the episode ends
    await worker.sweep()
    worker.report(NODE, 210.0, usage(("uid-hungry", 2000)))  # over again: a new episode, told again
    await worker.sweep()
    assert api.reasons() == [("Pod", "hungry", OVER), ("Pod", "hungry", OVER)]
    assert "uses 2000 MiB" in api.events[1]["message"]


async def test_two_replicas_record_one_event() -> None:
    api, clock = NamedEvents(), Clock()
    api.pod("hungry")
    replicas = [auditor(api, fleet(None, holding(pod("hungry"))), clock) for _ in range(2)]
    for worker in replicas:  # each sees the same inventory report
        worker.report(NODE, 10.0, usage(("uid-hungry", 1500)))
        await worker.sweep()
    assert api.reasons() == [("Pod", "hungry", OVER)]


async def test_evict_waits_out_the_grace_and_backs_off_when_refused() -> None:
    api, clock = NamedEvents(), Clock()
    api.pod("hungry")
    api.pod("modest")
    api.refuse["hungry"] = 2
    view = fleet(None, holding(pod("hungry")), holding(pod("modest")))
    worker = auditor(api, view, clock, action="evict")
    evicted, refused = counted("evicted"), counted("refused")
    worker.report(NODE, 10.0, usage(("uid-hungry", 1500), ("uid-modest", 1000)))
    tries = []
    for second in range(100):
        clock.now = 1000.0 + second
        before = len(api.evicted)
        await worker.sweep()
        if len(api.evicted) > before:
            tries.append(second)
    assert tries == [60, 65, 75]  # the grace, then refused twice (back-off 5, 10)
    assert [name for name, _ in api.evicted] == ["hungry"] * 3  # the neighbour within its grant stays
    assert all(body["deleteOptions"]["preconditions"]["uid"] == "uid-hungry" for _, body in api.evicted)
    assert api.reasons() == [("Pod", "hungry", OVER), ("Pod", "hungry", EVICTED)]
    assert "evicted if still over 60s" in api.events[0]["message"]
    assert (counted("evicted") - evicted, counted("refused") - refused) == (1, 2)


async def test_a_pod_back_within_its_grant_during_the_grace_is_not_evicted() -> None:
    api, clock = NamedEvents(), Clock()
    api.pod("hungry")
    worker = auditor(api, fleet(None, holding(pod("hungry"))), clock, action="evict")
    worker.report(NODE, 10.0, usage(("uid-hungry", 1500)))
    await worker.sweep()
    clock.now += 30
    worker.report(NODE, 40.0, usage(("uid-hungry", 900)))
    await worker.sweep()
    clock.now += 60
    await worker.sweep()
    assert api.evicted == []
    assert worker.episodes == {}


async def test_a_pod_replaced_by_another_of_its_name_is_not_evicted() -> None:
    api, clock = NamedEvents(), Clock()
    api.pod("hungry", uid="another-uid")
    worker = auditor(api, fleet(None, holding(pod("hungry"))), clock, action="evict")
    worker.report(NODE, 10.0, usage(("uid-hungry", 1500)))
    await worker.sweep()
    clock.now += 61
    await worker.sweep()
    assert api.evicted == []
