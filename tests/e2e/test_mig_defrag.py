"""Defragmentation for a MIG pod on the real control plane (docs/mig.md, "Defragmentation"): a
movable ReplicaSet's instances moved to another node's MIG card so that a 7g.40gb gets the card
they leave. After test_demo (its MIG step wants fresh cards: the instances made here stay, idle),
before test_preemption."""

from __future__ import annotations

import pytest

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import POLL_S, consistent, ledger, namespace, pod, running
from tests.e2e.test_defrag import defragmenting, idle, placed, replica_set, told
from tests.support.waiting import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

MIG_TARGET, MIG_SPARE = "a100-mig-0", "a100-mig-1"  # cards 0-1 in MIG mode (made on demand) / card 0


def mig(profile: str) -> dict[str, str]:
    return {f"gpuledger.io/mig-{profile}": "1"}


@pytest.mark.timeout(300)
async def test_a_mig_pod_that_fits_nowhere_gets_the_card_movable_pods_instances_leave(
    stack: Stack, cluster: RealCluster, api: KubeApi
) -> None:
    """A 7g.40gb pinned to a100-mig-0: one on-demand card holds a bare 7g.40gb, the other the two
    1g.10gb of a movable ReplicaSet, half of it free (the static card's 3g.20gb is held by a bare
    pod, and that card takes no 7g.40gb). Both are moved, their instances made again on
    a100-mig-1's MIG card, and the 7g.40gb takes the card they left, its instances destroyed for
    it. The free half is fenced from before the first eviction (docs/preemption.md, "The fence"):
    without the fence, the moved pods' new pods took it before the hold was written."""

    for node in (MIG_TARGET, MIG_SPARE):
        await wait_for(
            idle(stack, node, mig_only=True), 60, f"{node}'s MIG instances held by nobody (an earlier test's)", POLL_S
        )
    async with defragmenting(stack), namespace(api, "e2e-defrag-mig", stack) as ns:
        pods = f"/api/v1/namespaces/{ns}/pods"
        for name, node, profile in (("block", MIG_SPARE, "7g.40gb"), ("keep", MIG_TARGET, "7g.40gb"),
                                    ("static", MIG_TARGET, "3g.20gb")):  # fmt: skip
            await api.create(pods, pod(name, ns, mig(profile), node=node))
            await running(api, ns, name)
        movable = replica_set(ns, mig("1g.10gb"), (MIG_TARGET, MIG_SPARE))
        await api.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", movable)
        first = await wait_for(placed(api, ns), 90, "the ReplicaSet's two pods Running", POLL_S)
        assert {p["spec"]["nodeName"] for p in first} == {MIG_TARGET}
        before = (await ledger(stack))[MIG_TARGET]
        uids = {p["metadata"]["uid"] for p in first}
        held = [s for a in before.live() if a.owner.id in uids for s in a.shares()]
        (their_card,) = {s.index for s in held}
        assert sum(s.mig.size for s in held if s.mig is not None) == 4, held  # half of the card is free
        await api.delete(f"{pods}/block", grace_s=0)
        await wait_for(idle(stack, MIG_SPARE, mig_only=True), 60, f"{MIG_SPARE} free again", POLL_S)

        await api.create(pods, pod("big", ns, mig("7g.40gb"), node=MIG_TARGET))
        big = await running(api, ns, "big", timeout=120)
        assert big["spec"]["nodeName"] == MIG_TARGET
        events, moved = await told(api, ns)
        assert moved == {p["metadata"]["name"] for p in first}, moved
        assert any(e.get("reason") == "GpuledgerDefragmenting" for e in events)

        after = await wait_for(placed(api, ns, moved), 90, "the moved pods recreated and Running", POLL_S)
        assert {p["spec"]["nodeName"] for p in after} == {MIG_SPARE}
        target = (await ledger(stack))[MIG_TARGET]
        (mine,) = [a for a in target.live() if a.owner.id == big["metadata"]["uid"]]
        (taken,) = mine.shares()
        assert taken.index == their_card and taken.mig is not None and taken.mig.profile == "7g.40gb"
        card = next(c for c in target.node.cards if c.index == their_card)
        assert [i.slot.profile for i in card.instances] == ["7g.40gb"], card.instances  # the 1g.10gb destroyed
        await consistent(cluster, stack)
        await api.delete(f"/apis/apps/v1/namespaces/{ns}/replicasets/movable")
