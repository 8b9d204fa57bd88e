"""Resource quantities as users write them and as the API server stores them (canonical form:
`4000` is stored as `4k`). gpu-mem is a count of MiB: any whole-number quantity means exactly that
many MiB; binary suffixes (`2Gi`) are refused with a reason naming the field; fractions (`500m`)
are refused by the API server itself, which takes only whole numbers for extended resources."""

from __future__ import annotations

import pytest

from gpuledger_dev.controlplane.api import ApiError, KubeApi
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import get_pod, namespace, pod, released, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

NODE = "p4-1"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("written", "mib"), [("4000", 4000), ("4k", 4000), ("1e3", 1000), ("2048", 2048)])
async def test_whole_number_forms_mean_exactly_that_many_mib(
    stack: Stack, cluster: RealCluster, api: KubeApi, written: str, mib: int
) -> None:
    name = f"mem-{written.lower()}"
    async with namespace(api, f"e2e-quantity-{written.lower()}", stack) as ns:
        made = await api.create(
            f"/api/v1/namespaces/{ns}/pods",
            pod(name, ns, {"gpuledger.io/gpu": "1", "gpuledger.io/gpu-mem": written}, node=NODE),
        )
        stored = made["spec"]["containers"][0]["resources"]["limits"]["gpuledger.io/gpu-mem"]
        await running(api, ns, name)
        env = cluster.kubelets[NODE].container_envs(made["metadata"]["uid"])["app"]
        assert env["GPULEDGER_MEMORY_LIMIT_MIB"] == str(mib), (written, stored, env)
        await api.delete(f"/api/v1/namespaces/{ns}/pods/{name}", grace_s=0)
        await released(stack, made["metadata"]["uid"])


@pytest.mark.timeout(120)
async def test_a_binary_suffix_is_refused_with_the_field_named(
    stack: Stack, cluster: RealCluster, api: KubeApi
) -> None:
    async with namespace(api, "e2e-quantity-gi", stack) as ns:
        made = await api.create(
            f"/api/v1/namespaces/{ns}/pods",
            pod("mem-2gi", ns, {"gpuledger.io/gpu": "1", "gpuledger.io/gpu-mem": "2Gi"}, node=NODE),
        )
        outcome = await cluster.outcome(ns, "mem-2gi", made["metadata"]["uid"])
        assert not outcome.node
        assert "gpuledger.io/gpu-mem" in outcome.pending and "2048" in outcome.pending, outcome.pending
        assert (await get_pod(api, ns, "mem-2gi"))["status"]["phase"] == "Pending"


@pytest.mark.timeout(60)
async def test_a_fraction_is_refused_by_the_api_server(stack: Stack, api: KubeApi) -> None:
    async with namespace(api, "e2e-quantity-frac", stack) as ns:
        with pytest.raises(ApiError) as refused:
            await api.create(
                f"/api/v1/namespaces/{ns}/pods",
                pod("mem-frac", ns, {"gpuledger.io/gpu": "1", "gpuledger.io/gpu-mem": "500m"}, node=NODE),
            )
        assert refused.value.status == 422
        assert "gpuledger.io/gpu-mem" in str(refused.value)
