"""The extender over HTTPS: only a caller presenting a client certificate of the extender's client CA,
with a common name placement lets in, reaches a verb; the ops endpoints stay plain HTTP and serve
no verb. A real placement service (in this process) over a real nats-server and allocator."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gpuledger_common.natsserver import NatsServer
from gpuledger_testing.extender_pki import ExtenderPki
from gpuledger_testing.stack import RunningAllocator, RunningPlacement, running_placement
from gpuledger_testing.tlsca import ThrowawayCa
from tests.integration.placement.helpers import args, gpu_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODES = ["h100-0", "p4-0"]


@pytest.fixture
def pki(tmp_path: Path) -> ExtenderPki:
    return ExtenderPki(tmp_path / "pki")


@pytest.fixture
async def placement(
    nats_server: NatsServer, allocator: RunningAllocator, pki: ExtenderPki
) -> AsyncIterator[RunningPlacement]:
    tls = {
        "extender_cert_file": str(pki.server.cert),
        "extender_key_file": str(pki.server.key),
        "extender_client_ca_file": str(pki.ca.cert),
    }
    async with running_placement(nats_server.url, **tls) as running:
        yield running


async def filter_with(placement: RunningPlacement, tls: ssl.SSLContext | bool) -> tuple[int, str]:
    connector = aiohttp.TCPConnector(ssl=tls)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=5)) as http,
        http.post(f"{placement.url}/filter", json=args(gpu_pod("p", gpu=8), NODES)) as reply,
    ):
        return reply.status, await reply.text()


async def test_kube_schedulers_certificate_reaches_the_verbs(placement: RunningPlacement, pki: ExtenderPki) -> None:
    assert placement.url.startswith("https://")
    status, body = await filter_with(placement, pki.client())
    assert status == 200 and '"NodeNames":["h100-0"]' in body


async def test_a_caller_without_a_client_certificate_is_refused_in_the_handshake(
    placement: RunningPlacement, pki: ExtenderPki
) -> None:
    only_ca = ssl.create_default_context(cafile=str(pki.ca.cert))
    with pytest.raises(aiohttp.ClientError):
        await filter_with(placement, only_ca)


async def test_a_certificate_of_another_ca_is_refused(
    placement: RunningPlacement, pki: ExtenderPki, tmp_path: Path
) -> None:
    stranger = ThrowawayCa(tmp_path / "other", "someone-else-ca").issue("gpuledger-scheduler", client=True)
    with pytest.raises(aiohttp.ClientError):
        await filter_with(placement, pki.client(stranger))


async def test_a_certificate_of_the_ca_with_another_name_is_forbidden(
    placement: RunningPlacement, pki: ExtenderPki
) -> None:
    intruder = pki.ca.issue("some-controller", client=True)
    status, body = await filter_with(placement, pki.client(intruder))
    assert status == 403 and "'some-controller' may not call the extender" in body


async def test_plain_http_to_the_extender_port_gets_nothing(placement: RunningPlacement) -> None:
    plain = placement.url.replace("https://", "http://")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.post(f"{plain}/filter", json=args(gpu_pod("p"), NODES)) as reply:
                await reply.read()


async def test_the_ops_port_serves_probes_and_no_verb(placement: RunningPlacement) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        async with http.get(f"{placement.ops_url}/readyz") as reply:
            assert reply.status == 200
        for verb in ("filter", "prioritize", "bind"):
            async with http.post(f"{placement.ops_url}/gpuledger/{verb}", json={}) as reply:
                assert reply.status == 404, verb
