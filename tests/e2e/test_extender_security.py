"""The extender channel on the real control plane: kube-scheduler reaches the extender over HTTPS
with its client certificate (the scheduler configuration's ``enableHTTPS`` and ``tlsConfig``); a
client without that certificate is refused; and ``/bind``, even from the scheduler's certificate,
binds only pods of gpuledger's scheduler that nobody has bound yet."""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp
import pytest

from gpuledger_dev.controlplane.api import KubeApi
from gpuledger_dev.local_stack import Stack
from gpuledger_dev.tlsca import ThrowawayCa
from tests.e2e.helpers import get_pod, live_allocations_of, namespace, pod, running, share

pytestmark = pytest.mark.asyncio(loop_scope="session")

NODE = "p4-0"


async def call(stack: Stack, verb: str, body: dict[str, Any], tls: ssl.SSLContext) -> tuple[int, Any]:
    connector = aiohttp.TCPConnector(ssl=tls)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.post(f"{stack.extender}/{verb}", json=body) as reply,
    ):
        return reply.status, await reply.json(content_type=None) if reply.status == 200 else await reply.text()


def bind_args(made: dict[str, Any], node: str) -> dict[str, str]:
    meta = made["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


@pytest.mark.timeout(120)
async def test_kube_scheduler_schedules_through_the_extender_over_https(stack: Stack, api: KubeApi) -> None:
    assert stack.extender.startswith("https://")
    async with namespace(api, "e2e-extender-https", stack) as ns:
        made = await api.create(f"/api/v1/namespaces/{ns}/pods", pod("shared", ns, share(2000), node=NODE))
        await running(api, ns, "shared")
        found = await get_pod(api, ns, "shared")
        assert "gpuledger.io/allocation" in found["metadata"]["annotations"]  # bound by the extender
        assert len(await live_allocations_of(stack, made["metadata"]["uid"])) == 1


@pytest.mark.timeout(60)
async def test_a_client_without_the_schedulers_certificate_is_refused(stack: Stack, tmp_path: Any) -> None:
    body = {"PodName": "x", "PodNamespace": "default", "PodUID": "u", "Node": NODE}
    only_ca = ssl.create_default_context(cafile=str(stack.pki.ca.cert))
    with pytest.raises(aiohttp.ClientError):
        await call(stack, "bind", body, only_ca)
    stranger = ThrowawayCa(tmp_path / "other", "other-ca").issue("gpuledger-scheduler", client=True)
    with pytest.raises(aiohttp.ClientError):
        await call(stack, "bind", body, stack.pki.client(stranger))
    intruder = stack.pki.ca.issue("not-the-scheduler", client=True)
    status, text = await call(stack, "bind", body, stack.pki.client(intruder))
    assert status == 403 and "not-the-scheduler" in text


@pytest.mark.timeout(60)
async def test_bind_refuses_a_pod_of_another_scheduler(stack: Stack, api: KubeApi) -> None:
    async with namespace(api, "e2e-extender-foreign", stack) as ns:
        theirs = pod("theirs", ns, share(2000))
        theirs["spec"]["schedulerName"] = "someone-elses-scheduler"  # no such scheduler runs: it stays Pending
        made = await api.create(f"/api/v1/namespaces/{ns}/pods", theirs)
        status, answer = await call(stack, "bind", bind_args(made, NODE), stack.pki.client())
        assert status == 200
        assert "names scheduler 'someone-elses-scheduler'" in answer["Error"]
        assert not (await get_pod(api, ns, "theirs"))["spec"].get("nodeName")
        assert await live_allocations_of(stack, made["metadata"]["uid"]) == []


@pytest.mark.timeout(60)
async def test_bind_refuses_a_pod_someone_else_bound(stack: Stack, api: KubeApi) -> None:
    async with namespace(api, "e2e-extender-prebound", stack) as ns:
        bound = pod("prebound", ns, share(2000))
        bound["spec"]["nodeName"] = NODE  # bound at creation, past every scheduler
        made = await api.create(f"/api/v1/namespaces/{ns}/pods", bound)
        status, answer = await call(stack, "bind", bind_args(made, NODE), stack.pki.client())
        assert status == 200
        assert f"bound to {NODE} already, without a gpuledger reservation" in answer["Error"]
        assert await live_allocations_of(stack, made["metadata"]["uid"]) == []
