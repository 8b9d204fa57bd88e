"""The extender over HTTPS: only a caller presenting a client certificate of the extender's client CA,
with a common name placement lets in, reaches a verb; the ops endpoints stay plain HTTP and serve
no verb. kube-scheduler's Go client speaks HTTP/2 (ALPN ``h2``), every call on one connection; a
client offering only ``http/1.1`` is served on the same port. A real placement service (in this
process) over a real nats-server and allocator."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import REGISTRY

from gpuledger_dev.extender_pki import ExtenderPki
from gpuledger_dev.natsserver import NatsServer
from gpuledger_dev.tlsca import ThrowawayCa
from tests.integration.placement.helpers import args, gpu_pod
from tests.integration.security.h2client import h2_calls
from tests.support.replicas import RunningAllocator, RunningPlacement, running_placement

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


def _h2_calls(placement: RunningPlacement, tls: ssl.SSLContext, calls: list[tuple[str, str, bytes]]) -> Any:
    return h2_calls("127.0.0.1", placement.settings.extender_port, tls, calls)


def _connections(protocol: str) -> float:
    found = REGISTRY.get_sample_value("gpuledger_placement_extender_connections_total", {"protocol": protocol})
    return found or 0.0


async def test_kube_scheduler_speaks_http2_every_call_on_one_connection(
    placement: RunningPlacement, pki: ExtenderPki
) -> None:
    before = _connections("h2")
    prefix = placement.settings.url_prefix
    calls = [("POST", f"{prefix}/filter", json.dumps(args(gpu_pod(f"p{i}"), NODES)).encode()) for i in range(5)]
    calls.append(("POST", f"{prefix}/prioritize", json.dumps(args(gpu_pod("q"), NODES)).encode()))
    chosen, answers = await _h2_calls(placement, pki.client(), calls)
    assert chosen == "h2"
    assert [a.status for a in answers] == [200] * 6
    assert all(json.loads(a.body)["NodeNames"] in (["h100-0"], ["p4-0"]) for a in answers[:5])
    assert {entry["Host"] for entry in json.loads(answers[5].body)} == set(NODES)
    assert _connections("h2") == before + 1


async def test_http2_refuses_a_certificate_of_another_name_and_unknown_paths(
    placement: RunningPlacement, pki: ExtenderPki
) -> None:
    prefix = placement.settings.url_prefix
    body = json.dumps(args(gpu_pod("p"), NODES)).encode()
    _, (intruded,) = await _h2_calls(
        placement, pki.client(pki.ca.issue("some-controller", client=True)), [("POST", f"{prefix}/bind", body)]
    )
    assert intruded.status == 403 and b"'some-controller' may not call the extender" in intruded.body
    _, (unknown, read) = await _h2_calls(
        placement, pki.client(), [("POST", f"{prefix}/evict", body), ("GET", f"{prefix}/filter", b"")]
    )
    assert (unknown.status, read.status) == (404, 405)


async def test_http2_answers_a_filter_larger_than_a_flow_control_window(
    placement: RunningPlacement, pki: ExtenderPki
) -> None:
    names = [f"unknown-node-{i:05d}" for i in range(2000)]  # each fails with its reason: about 180 KB
    body = json.dumps(args(gpu_pod("p"), names)).encode()
    assert len(body) < 65535  # the client sends it within the first window
    _, (answer,) = await _h2_calls(placement, pki.client(), [("POST", f"{placement.settings.url_prefix}/filter", body)])
    assert answer.status == 200 and len(answer.body) > 65535
    assert len(json.loads(answer.body)["FailedNodes"]) == 2000


async def test_an_http11_client_is_served_on_the_same_port(placement: RunningPlacement, pki: ExtenderPki) -> None:
    before = _connections("http/1.1")
    status, _ = await filter_with(placement, pki.client())  # aiohttp offers http/1.1 only
    assert status == 200 and _connections("http/1.1") == before + 1


@pytest.fixture
async def small_bodies(
    nats_server: NatsServer, allocator: RunningAllocator, pki: ExtenderPki
) -> AsyncIterator[RunningPlacement]:
    tls = {
        "extender_cert_file": str(pki.server.cert),
        "extender_key_file": str(pki.server.key),
        "extender_client_ca_file": str(pki.ca.cert),
    }
    async with running_placement(nats_server.url, max_body_bytes=2048, **tls) as running:
        yield running


async def test_http2_refuses_a_body_over_the_limit_and_serves_the_next(
    small_bodies: RunningPlacement, pki: ExtenderPki
) -> None:
    prefix = small_bodies.settings.url_prefix
    large = json.dumps(args(gpu_pod("p"), [f"node-{i}" for i in range(400)])).encode()
    small = json.dumps(args(gpu_pod("q"), NODES)).encode()
    _, (refused, served) = await _h2_calls(
        small_bodies, pki.client(), [("POST", f"{prefix}/filter", large), ("POST", f"{prefix}/filter", small)]
    )
    assert refused.status == 413 and b"larger than 2048 bytes" in refused.body
    assert served.status == 200
