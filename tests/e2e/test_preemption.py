"""Share-aware preemption on the real control plane (docs/preemption.md): a high-priority 5 GiB
share on a node whose two cards are full of low-priority 2-4 GiB shares. kube-scheduler's own
preemption finds no victim (its dry run counts the node's slots, which are far from full); placement
evicts exactly the smallest set of low-priority pods on one card, holds the room, and the pod binds
there once they are gone. Nothing else is evicted, and a pod of equal priority evicts nobody."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import (
    HIGH,
    LOW,
    POLL_S,
    consistent,
    get_pod,
    ledger,
    namespace,
    pod,
    pods_in,
    priority_classes,
    running,
    share,
    smallest_sets,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

NODE = "p4-1"  # two Tesla P4 of 7611 MiB
SHARES = (4096, 2048, 2048, 2048, 2048)  # MiB: best fit puts 4 + 2 GiB on one card, 2 + 2 + 2 on the other
WANT = 5120


def prioritized(name: str, ns: str, mib: int, priority_class: str) -> dict[str, Any]:
    return with_priority(pod(name, ns, share(mib), node=NODE), priority_class)


def with_priority(body: dict[str, Any], priority_class: str) -> dict[str, Any]:
    body["spec"]["priorityClassName"] = priority_class
    return body


@pytest.mark.timeout(240)
async def test_a_high_priority_share_evicts_the_fewest_low_priority_shares_on_one_card(
    stack: Stack, cluster: RealCluster, api: KubeApi
) -> None:
    async def node_idle() -> bool:
        found = (await ledger(stack)).get(NODE)
        return found is not None and not list(found.live())

    await wait_for(node_idle, 60, f"{NODE}'s cards held by nobody (an earlier test's pods gone)", POLL_S)
    async with priority_classes(api), namespace(api, "e2e-preemption", stack) as ns:
        uids: dict[str, str] = {}
        for i, mib in enumerate(SHARES):  # one at a time: each lands where the policy puts it
            made = await api.create(f"/api/v1/namespaces/{ns}/pods", prioritized(f"low-{i}", ns, mib, LOW))
            await running(api, ns, f"low-{i}")
            uids[made["metadata"]["uid"]] = f"low-{i}"
        before = (await ledger(stack))[NODE]
        expected = smallest_sets(before, uids, WANT)
        assert expected and all(len(s) < len(SHARES) for s in expected), expected

        same = await api.create(f"/api/v1/namespaces/{ns}/pods", prioritized("equal", ns, WANT, LOW))
        why = await wait_for(lambda: cluster.scheduling_failure(ns, "equal", same["metadata"]["uid"]), 60,
                             "the equal-priority pod refused", POLL_S)  # fmt: skip
        assert "MiB" in why, why

        await api.create(f"/api/v1/namespaces/{ns}/pods", prioritized("high", ns, WANT, HIGH))
        try:
            high = await running(api, ns, "high", timeout=120)
        except TimeoutError as err:
            said = [line for line in stack.supervisor.get("placement").log.read_text(errors="replace").splitlines()
                    if "preempt" in line.lower() or "bind" in line.lower()]  # fmt: skip
            events = [f"{e['involvedObject']['name']}: {e.get('reason')}: {e.get('message')}"
                      for e in (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]]  # fmt: skip
            scheduler = cluster.control_plane.processes["kube-scheduler"].log_path.read_text(errors="replace")
            about = [line for line in scheduler.splitlines() if "schedule_one.go:298" not in line][-40:]
            about += [f"{p['metadata']['name']}: {p['status'].get('phase')} {p['metadata'].get('deletionTimestamp')}"
                      for p in await pods_in(api, ns)]  # fmt: skip
            raise AssertionError("\n".join([str(err), *said[-30:], *events[-30:], *about])) from None
        assert high["spec"]["nodeName"] == NODE

        left = {p["metadata"]["name"] for p in await pods_in(api, ns) if not p["metadata"].get("deletionTimestamp")}
        evicted = {name for name in uids.values() if name not in left}
        assert evicted in expected, f"evicted {sorted(evicted)}; the smallest sets were {expected}"
        assert "equal" in left and (await get_pod(api, ns, "equal"))["spec"].get("nodeName") in (None, "")

        events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
        preempted = {e["involvedObject"]["name"] for e in events if e.get("reason") == "Preempted"}
        assert preempted == evicted
        held = next(e["message"] for e in events if e.get("reason") == "GpuledgerPreempting")
        assert NODE in held and all(name in held for name in evicted), held

        after = (await ledger(stack))[NODE]
        mine = [a for a in after.live() if a.owner.id == high["metadata"]["uid"]]
        assert len(mine) == 1 and mine[0].shares()[0].mem_mib == WANT
        victim_cards = {s.index for a in before.live() if uids.get(a.owner.id) in evicted for s in a.shares()}
        assert {s.index for s in mine[0].shares()} == victim_cards
        await consistent(cluster, stack)


MIG_NODE = "a100-mig-0"  # cards 0 and 1 in MIG mode, instances made on demand; card 2 static (3g, 2g, 1g, 1g)


def mig_pod(name: str, ns: str, profile: str, priority_class: str) -> dict[str, Any]:
    return with_priority(pod(name, ns, {f"gpuledger.io/mig-{profile}": "1"}, node=MIG_NODE), priority_class)


@pytest.mark.timeout(300)
async def test_a_high_priority_mig_pod_evicts_only_the_holders_of_the_placement_it_needs(
    stack: Stack, cluster: RealCluster, api: KubeApi
) -> None:
    """A high-priority 7g.40gb takes one of the node's on-demand cards whole; four low-priority
    2g.10gb fill the static 2g.10gb and the other card's 2g placements (0, 2, 4). A high-priority
    4g.20gb (start 0 only, never on the static card) then evicts exactly the two 2g at 0 and 2 of
    that card, nothing else; their instances, made on demand, are destroyed to make its own."""

    async def mig_idle() -> bool:
        found = (await ledger(stack)).get(MIG_NODE)
        return found is not None and not any(s.mig for a in found.live() for s in a.shares())

    await wait_for(mig_idle, 60, f"{MIG_NODE}'s MIG instances held by nobody (an earlier test's pods gone)", POLL_S)
    async with priority_classes(api), namespace(api, "e2e-preemption-mig", stack) as ns:
        await api.create(f"/api/v1/namespaces/{ns}/pods", mig_pod("keep", ns, "7g.40gb", HIGH))
        keep = await running(api, ns, "keep")
        uids: dict[str, str] = {}
        for i in range(4):  # one at a time: each where the chooser puts it
            made = await api.create(f"/api/v1/namespaces/{ns}/pods", mig_pod(f"low-{i}", ns, "2g.10gb", LOW))
            await running(api, ns, f"low-{i}")
            uids[made["metadata"]["uid"]] = f"low-{i}"
        before = (await ledger(stack))[MIG_NODE]
        kept = {s.index for a in before.live() if a.owner.id == keep["metadata"]["uid"] for s in a.shares()}
        others = {c.index for c in before.node.cards if c.mig and not any(i.static for i in c.instances)} - kept
        assert len(others) == 1, (kept, before.node.cards, [(a.owner.name, a.shares()) for a in before.live()])
        (other,) = others
        expected = {uids[a.owner.id] for a in before.live() if a.owner.id in uids for s in a.shares()
                    if s.index == other and s.mig is not None and s.mig.start < 4}  # fmt: skip
        assert len(expected) == 2, (expected, [(a.owner.name, a.shares()) for a in before.live()])

        await api.create(f"/api/v1/namespaces/{ns}/pods", mig_pod("want", ns, "4g.20gb", HIGH))
        want = await running(api, ns, "want", timeout=120)
        left = {p["metadata"]["name"] for p in await pods_in(api, ns) if not p["metadata"].get("deletionTimestamp")}
        evicted = {name for name in uids.values() if name not in left}
        assert evicted == expected and "keep" in left
        events = (await api.get(f"/api/v1/namespaces/{ns}/events"))["items"]
        assert {e["involvedObject"]["name"] for e in events if e.get("reason") == "Preempted"} == expected

        after = (await ledger(stack))[MIG_NODE]
        (mine,) = [a for a in after.live() if a.owner.id == want["metadata"]["uid"]]
        (taken,) = mine.shares()
        assert taken.index == other and taken.mig is not None and (taken.mig.profile, taken.mig.start) == ("4g.20gb", 0)
        card = next(c for c in after.node.cards if c.index == other)
        made = [(i.slot.profile, i.slot.start) for i in card.instances if i.slot.start < 4]
        assert made == [("4g.20gb", 0)], card.instances  # the 2g at 0 and 2 destroyed for it
        await consistent(cluster, stack)
