"""A pod's cards come back however it ends: deleted, completed, force-deleted; and a pod recreated
under the same name (as a StatefulSet does) never inherits its predecessor's cards."""

from __future__ import annotations

import pytest

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.local_stack import Stack
from tests.e2e.helpers import get_pod, gone, live_allocations_of, namespace, pod, released, running, share

pytestmark = pytest.mark.asyncio(loop_scope="session")

NODE = "a100-1"


@pytest.mark.timeout(120)
async def test_deleting_a_pod_releases_its_cards(stack: Stack, api: KubeApi) -> None:
    async with namespace(api, "e2e-delete", stack) as ns:
        made = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("deleted", ns, share(4000), node=NODE))
        uid = made["metadata"]["uid"]
        await running(api, ns, "deleted")
        assert len(await live_allocations_of(stack, uid)) == 1
        await api.delete(f"/api/v1/namespaces/{ns}/pods/deleted")
        await released(stack, uid)


@pytest.mark.timeout(120)
async def test_a_completed_pod_releases_its_cards(stack: Stack, api: KubeApi) -> None:
    async with namespace(api, "e2e-complete", stack) as ns:
        made = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("done", ns, share(4000), node=NODE))
        uid = made["metadata"]["uid"]
        await running(api, ns, "done")
        await api.patch(
            f"/api/v1/namespaces/{ns}/pods/done", {"metadata": {"annotations": {"gpuledger.io/test-complete": "true"}}}
        )
        await released(stack, uid)
        assert (await get_pod(api, ns, "done"))["status"]["phase"] == "Succeeded"


@pytest.mark.timeout(120)
async def test_a_force_deleted_pod_releases_its_cards(stack: Stack, api: KubeApi) -> None:
    async with namespace(api, "e2e-force", stack) as ns:
        made = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("forced", ns, share(4000), node=NODE))
        uid = made["metadata"]["uid"]
        await running(api, ns, "forced")
        await api.delete(f"/api/v1/namespaces/{ns}/pods/forced", grace_s=0)
        await released(stack, uid)


@pytest.mark.timeout(180)
async def test_a_pod_recreated_under_the_same_name_gets_its_own_allocation(stack: Stack, api: KubeApi) -> None:
    async with namespace(api, "e2e-recreate", stack) as ns:
        first = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("web-0", ns, share(30000), node=NODE))
        await running(api, ns, "web-0")
        [before] = await live_allocations_of(stack, first["metadata"]["uid"])
        await api.delete(f"/api/v1/namespaces/{ns}/pods/web-0", grace_s=0)
        await gone(api, ns, "web-0")  # the API server answers a pod on a node with its deletion begun
        second = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("web-0", ns, share(30000), node=NODE))
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        await running(api, ns, "web-0")
        [after] = await live_allocations_of(stack, second["metadata"]["uid"])
        assert after.id != before.id
        assert after.owner.id == second["metadata"]["uid"]
        await released(stack, first["metadata"]["uid"])
