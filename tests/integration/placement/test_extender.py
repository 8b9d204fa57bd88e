"""The extender over HTTP against a real nats-server and ledger: filter, prioritize, bad input."""

from __future__ import annotations

import time

import aiohttp
import pytest

from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.natsserver import NatsServer
from tests.support.replicas import RunningAllocator, RunningPlacement, running_placement, wait_for

from .helpers import args, bind_args, gpu_pod, post

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODES = ["rtx-0", "p4-0", "h100-0"]


async def test_filter_keeps_the_nodes_that_fit_and_says_why_not(
    placement: RunningPlacement, http: aiohttp.ClientSession
) -> None:
    pod = gpu_pod("train", gpu=2, mem=20000)
    status, body = await post(http, f"{placement.url}/filter", args(pod, [*NODES, "cpu-only-7"]))
    assert status == 200
    assert body["NodeNames"] == ["h100-0"]
    assert body["Error"] == ""
    assert body["Nodes"] is None
    unresolvable = body["FailedAndUnresolvableNodes"]
    assert "has 1 card(s) that qualify, the pod needs 2" in unresolvable["rtx-0"]
    assert "largest card has 7611 MiB, the pod needs 20000 MiB" in unresolvable["p4-0"]
    assert "no inventory" in body["FailedNodes"]["cpu-only-7"]


async def test_filter_reason_names_the_card_short_of_memory(
    placement: RunningPlacement, http: aiohttp.ClientSession, apiserver: FakeApiServer
) -> None:
    # Hold both P4 cards almost fully through two binds, then ask for more than is left.
    for name in ("a", "b"):
        apiserver.add_pod(gpu_pod(name, gpu=1, mem=7000))
        assert (await post(http, f"{placement.url}/bind", bind_args(name, "p4-0"))) == (200, {"Error": ""})

    async def reason() -> str | None:
        _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("c", gpu=1, mem=1000), ["p4-0"]))
        found: str | None = body["FailedNodes"].get("p4-0")
        return found

    why = await wait_for(reason, what="the binds in placement's view")
    assert "611 MiB free, 389 MiB short of 1000 MiB" in why


async def test_a_pod_without_gpuledger_resources_passes_through(
    placement: RunningPlacement, http: aiohttp.ClientSession
) -> None:
    pod = gpu_pod("web")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    status, body = await post(http, f"{placement.url}/filter", args(pod, [*NODES, "anything"]))
    assert status == 200
    assert body["NodeNames"] == [*NODES, "anything"]
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}


async def test_prioritize_scores_the_candidates_from_0_to_10(
    placement: RunningPlacement, http: aiohttp.ClientSession
) -> None:
    pod = gpu_pod("infer", gpu=1, mem=4000, annotations={"gpuledger.io/placement": "binpack"})
    status, body = await post(http, f"{placement.url}/prioritize", args(pod, NODES))
    assert status == 200
    assert [entry["Host"] for entry in body] == NODES
    scores = {entry["Host"]: entry["Score"] for entry in body}
    assert all(0 <= s <= 10 for s in scores.values())
    assert scores["rtx-0"] == 10  # binpack: the node with least room left after
    assert scores["h100-0"] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"Pod": {}, "NodeNames": "h100-0"}', "NodeNames: must be a list"),
        (b'{"NodeNames": []}', "Pod: is required"),
    ],
)
async def test_malformed_requests_get_400_with_a_message(
    placement: RunningPlacement, http: aiohttp.ClientSession, body: bytes, message: str
) -> None:
    for verb in ("filter", "prioritize"):
        async with http.post(f"{placement.url}/{verb}", data=body, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            text = await r.text()
            assert message in text
            assert "Traceback" not in text


async def test_malformed_bind_gets_400(placement: RunningPlacement, http: aiohttp.ClientSession) -> None:
    status, text = await post(http, f"{placement.url}/bind", {"PodName": "x", "PodNamespace": "default"})
    assert status == 400
    assert "PodUID" in text


async def test_a_body_over_the_limit_gets_413_and_nothing_else(
    nats_server: NatsServer, allocator: RunningAllocator
) -> None:
    async with (
        running_placement(nats_server.url, max_body_bytes=64 * 1024) as small,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
    ):
        names = [f"node-{i:06d}" for i in range(8000)]  # ~130 KB of node names
        status, text = await post(http, f"{small.url}/filter", args(gpu_pod("big"), names))
        assert status == 413
        assert "Traceback" not in str(text)
        status, body = await post(http, f"{small.url}/filter", args(gpu_pod("small"), NODES))
        assert status == 200 and len(body["NodeNames"]) == 1


async def test_a_pod_of_another_scheduler_gets_no_node(
    placement: RunningPlacement, http: aiohttp.ClientSession
) -> None:
    pod = gpu_pod("theirs", gpu=1)
    pod["spec"]["schedulerName"] = "default-scheduler"
    status, body = await post(http, f"{placement.url}/filter", args(pod, NODES))
    assert status == 200 and body["NodeNames"] == []
    why = body["FailedAndUnresolvableNodes"]["h100-0"]
    assert "only pods of gpuledger-scheduler; this one names 'default-scheduler'" in why


async def test_a_pod_with_nonsense_resources_is_unschedulable_with_the_reason(
    placement: RunningPlacement, http: aiohttp.ClientSession
) -> None:
    pod = gpu_pod("bad", gpu=1, mem=None, core=150)
    status, body = await post(http, f"{placement.url}/filter", args(pod, NODES))
    assert status == 200
    assert body["NodeNames"] == []
    assert set(body["FailedAndUnresolvableNodes"]) == set(NODES)
    assert "gpuledger.io/gpu-core: must be 1..100 percent" in body["FailedAndUnresolvableNodes"]["h100-0"]


async def test_filter_fails_fast_with_an_error_when_the_ledger_is_unreachable(
    placement: RunningPlacement, http: aiohttp.ClientSession, nats_server: NatsServer
) -> None:
    await nats_server.kill()
    try:

        async def failing() -> str | None:
            started = time.monotonic()
            _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("p"), NODES))
            assert time.monotonic() - started < 1.0
            return body["Error"] or None

        error = await wait_for(failing, timeout=5, what="filter to report the ledger unreachable")
        assert "ledger is unreachable" in error
        started = time.monotonic()
        status, body = await post(http, f"{placement.url}/filter", args(gpu_pod("p"), NODES))
        assert status == 200 and body["NodeNames"] is None and "unreachable" in body["Error"]
        assert time.monotonic() - started < 1.0
        # A pod that is not ours still passes: the ledger has nothing to say about it.
        plain = gpu_pod("web")
        plain["spec"]["containers"][0]["resources"] = {}
        _, body = await post(http, f"{placement.url}/filter", args(plain, NODES))
        assert body["NodeNames"] == NODES and body["Error"] == ""
    finally:
        await nats_server.start()
