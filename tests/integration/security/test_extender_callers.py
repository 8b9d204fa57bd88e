"""Whose copy of a pod a bind may take: filter keeps its caller's copy of the pod as the pod's
assumption, and a bind takes that copy instead of reading the pod only when the same identified
caller (its client certificate's common name) sent it. Another caller's filter body cannot steer
the scheduler's bind: a forged copy that names gpuledger-scheduler for a pod of another scheduler
is read afresh at bind and refused. A real placement service over HTTPS, a real nats-server and
allocator, the fake API server (held to the real one by the contract tests)."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client

from gpuledger_common.store import LedgerStore
from gpuledger_core.ledger import NodeLedger
from gpuledger_dev.extender_pki import ExtenderPki
from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.natsserver import NatsServer
from tests.integration.placement.helpers import args, bind_args, gpu_pod
from tests.integration.security.h2client import h2_calls
from tests.support.replicas import RunningAllocator, RunningPlacement, running_placement

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODES = ["h100-0", "p4-0"]
PLANNER = "capacity-planner"  # a second client let in beside kube-scheduler


@pytest.fixture
def pki(tmp_path: Path) -> ExtenderPki:
    return ExtenderPki(tmp_path / "pki")


@pytest.fixture
async def placement(
    nats_server: NatsServer, allocator: RunningAllocator, apiserver: FakeApiServer, pki: ExtenderPki, tmp_path: Path
) -> AsyncIterator[RunningPlacement]:
    settings = {
        "extender_cert_file": str(pki.server.cert),
        "extender_key_file": str(pki.server.key),
        "extender_client_ca_file": str(pki.ca.cert),
        "extender_clients": f"gpuledger-scheduler,{PLANNER}",
        "kube": "kubeconfig",
        "kubeconfig": str(apiserver.kubeconfig(tmp_path / "kubeconfig")),
    }
    async with running_placement(nats_server.url, **settings) as running:
        yield running


async def http1(placement: RunningPlacement, tls: ssl.SSLContext, verb: str, body: Any) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as http,
        http.post(f"{placement.url}/{verb}", json=body) as reply,
    ):
        assert reply.status == 200, await reply.text()
        answer: dict[str, Any] = await reply.json(content_type=None)
        return answer


async def http2(placement: RunningPlacement, tls: ssl.SSLContext, verb: str, body: Any) -> dict[str, Any]:
    path = f"{placement.settings.url_prefix}/{verb}"
    chosen, (answer,) = await h2_calls(
        "127.0.0.1", placement.settings.extender_port, tls, [("POST", path, json.dumps(body).encode())]
    )
    assert chosen == "h2" and answer.status == 200, bytes(answer.body)
    found: dict[str, Any] = json.loads(answer.body)
    return found


Call = Callable[[RunningPlacement, ssl.SSLContext, str, Any], Awaitable[dict[str, Any]]]


async def held_by(nc: Client, uid: str) -> list[str]:
    store = await LedgerStore.open(nc)
    found: list[str] = []
    for node in NODES:
        ledger, _ = await store.read(node)
        assert isinstance(ledger, NodeLedger)
        found += [a.id for a in ledger.allocations if a.live and a.owner.id == uid]
    return found


def pod_reads(apiserver: FakeApiServer, name: str) -> int:
    return apiserver.requests.count(("GET", f"/api/v1/namespaces/default/pods/{name}"))


async def test_another_callers_filter_body_cannot_steer_the_schedulers_bind(
    placement: RunningPlacement, apiserver: FakeApiServer, pki: ExtenderPki, nc: Client
) -> None:
    real = gpu_pod("theirs", gpu=1)
    real["spec"]["schedulerName"] = "default-scheduler"  # not ours: gpuledger must never bind it
    apiserver.add_pod(real)
    forged = gpu_pod("theirs", gpu=1)  # the same name and uid, claiming to be of gpuledger-scheduler
    planner = pki.client(pki.ca.issue(PLANNER, client=True))
    [node] = (await http1(placement, planner, "filter", args(forged, NODES)))["NodeNames"]

    answer = await http2(placement, pki.client(), "bind", bind_args("theirs", node))
    assert "names scheduler 'default-scheduler'" in answer["Error"], answer
    assert pod_reads(apiserver, "theirs") == 1  # read afresh, not taken from the planner's copy
    assert apiserver.bindings == []
    assert apiserver.pod("default", "theirs")["spec"].get("nodeName") is None
    assert await held_by(nc, "uid-theirs") == []


@pytest.mark.parametrize("call", [http1, http2], ids=["http/1.1", "h2"])
async def test_the_schedulers_own_filter_is_taken_at_its_bind_without_reading_the_pod(
    placement: RunningPlacement, apiserver: FakeApiServer, pki: ExtenderPki, nc: Client, call: Call
) -> None:
    pod = gpu_pod("ours", gpu=1, mem=4000)
    apiserver.add_pod(pod)
    scheduler = pki.client()
    [node] = (await call(placement, scheduler, "filter", args(pod, NODES)))["NodeNames"]
    assert (await call(placement, scheduler, "bind", bind_args("ours", node))) == {"Error": ""}
    assert pod_reads(apiserver, "ours") == 0
    assert apiserver.pod("default", "ours")["spec"]["nodeName"] == node
    assert len(await held_by(nc, "uid-ours")) == 1


async def test_a_bind_after_the_planners_filter_reserves_what_the_pod_really_asks(
    placement: RunningPlacement, apiserver: FakeApiServer, pki: ExtenderPki, nc: Client
) -> None:
    apiserver.add_pod(gpu_pod("big", gpu=2, mem=30000))
    understated = gpu_pod("big", gpu=1, mem=1000)  # the planner's copy asks less than the pod does
    planner = pki.client(pki.ca.issue(PLANNER, client=True))
    assert (await http1(placement, planner, "filter", args(understated, ["h100-0"])))["NodeNames"] == ["h100-0"]
    assert (await http1(placement, pki.client(), "bind", bind_args("big", "h100-0"))) == {"Error": ""}
    store = await LedgerStore.open(nc)
    ledger, _ = await store.read("h100-0")
    assert isinstance(ledger, NodeLedger)
    [held] = [a for a in ledger.allocations if a.live and a.owner.id == "uid-big"]
    [grant] = held.grants
    assert [card.mem_mib for card in grant.cards] == [30000, 30000]
