"""MIG pods through the extender against a real nats-server and ledger: a node whose inventory
reports a card in MIG mode (as the node's inventory writes it) takes a MIG pod's instance on
filter, prioritize and bind; a card not in MIG mode is refused with the reason."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client

from gpuledger_common.announce import announce
from gpuledger_common.store import LedgerStore
from gpuledger_core import codec
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation
from gpuledger_core.slots import device_id
from gpuledger_dev.fake_apiserver import FakeApiServer
from tests.support.replicas import RunningPlacement, wait_for

from .helpers import MIG_NODE, STATIC, args, bind_args, mig_node, post

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODES = ["rtx-0", "p4-0", "h100-0", MIG_NODE]


def mig_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": {}},
        "spec": {
            "schedulerName": "gpuledger-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "cuda:12",
                    "resources": {"limits": limits, "requests": {"cpu": "1", **limits}},
                }
            ],
        },
    }


@pytest.fixture
async def store(nc: Client) -> LedgerStore:
    return await LedgerStore.open(nc)


@pytest.fixture
async def announced(placement: RunningPlacement, http: aiohttp.ClientSession, nc: Client) -> RunningPlacement:
    """The MIG node reported, and in placement's view."""
    await announce(nc, [mig_node()])

    async def seen() -> bool:
        probe = mig_pod("probe", {"gpuledger.io/mig-1g.5gb": "1"})
        _, body = await post(http, f"{placement.url}/prioritize", args(probe, [MIG_NODE]))
        return isinstance(body, list) and body[0]["Score"] == 10

    await wait_for(seen, what="the MIG node in placement's view")
    return placement


async def held(store: LedgerStore, uid: str) -> Allocation:
    ledger, _ = await store.read(MIG_NODE)
    assert isinstance(ledger, NodeLedger)
    [found] = [a for a in ledger.allocations if a.live and a.owner.id == uid]
    return found


async def test_a_mig_pod_is_filtered_prioritized_and_bound_onto_a_free_placement(
    announced: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    pod = mig_pod("infer", {"gpuledger.io/mig-1g.5gb": "1"})
    status, body = await post(http, f"{announced.url}/filter", args(pod, NODES))
    assert status == 200 and body["NodeNames"] == [MIG_NODE], body
    for never in ("rtx-0", "p4-0"):
        assert "whose model offers MIG 1g.5gb" in body["FailedAndUnresolvableNodes"][never]
    assert "whose model offers MIG 1g.5gb" in body["FailedAndUnresolvableNodes"]["h100-0"]  # an H100 has no 1g.5gb

    status, scores = await post(http, f"{announced.url}/prioritize", args(pod, NODES))
    assert status == 200
    assert {s["Host"]: s["Score"] for s in scores} == {"rtx-0": 0, "p4-0": 0, "h100-0": 0, MIG_NODE: 10}

    apiserver.add_pod(pod)
    assert await post(http, f"{announced.url}/bind", bind_args("infer", MIG_NODE)) == (200, {"Error": ""})
    allocation = await held(store, "uid-infer")
    [grant] = allocation.grants
    [share] = grant.cards
    card = mig_node().cards[0]
    assert share.uuid == card.uuid and share.mig is not None and share.mig.profile == "1g.5gb"
    assert share.mig.start + share.mig.size <= STATIC.slot.start  # a free placement beside the static 3g
    assert grant.device_ids == (device_id(card.uuid, 0),)
    mirrored = apiserver.pod("default", "infer")["metadata"]["annotations"]["gpuledger.io/allocation"]
    assert codec.allocation_from(codec.Reader(json.loads(mirrored))) == allocation


async def test_a_pod_asking_mig_with_gpu_mem_gets_the_smallest_profile(
    announced: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    pod = mig_pod("small", {"gpuledger.io/mig": "1", "gpuledger.io/gpu-mem": "8000"})
    status, body = await post(http, f"{announced.url}/filter", args(pod, NODES))
    assert status == 200 and body["NodeNames"] == [MIG_NODE], body
    apiserver.add_pod(pod)
    assert await post(http, f"{announced.url}/bind", bind_args("small", MIG_NODE)) == (200, {"Error": ""})
    [share] = (await held(store, "uid-small")).grants[0].cards
    assert share.mig is not None and share.mig.profile == "1g.10gb"  # A100 40 GB: 1g.5gb holds 4864 MiB


async def test_a_card_not_in_mig_mode_is_refused_with_a_reason(
    announced: RunningPlacement, apiserver: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    pod = mig_pod("wide", {"gpuledger.io/mig-3g.20gb": "2"})  # two cards: only card 0 is in MIG mode
    status, body = await post(http, f"{announced.url}/filter", args(pod, [MIG_NODE]))
    assert status == 200 and body["NodeNames"] == []
    why = body["FailedNodes"][MIG_NODE]
    assert "MIG 3g.20gb: 1 of the 2 instances found room, one per card" in why and "card 1 in whole mode" in why
    h100 = mig_pod("elsewhere", {"gpuledger.io/mig-1g.10gb": "1"})
    status, body = await post(http, f"{announced.url}/filter", args(h100, ["h100-0"]))
    assert "no card in MIG mode for MIG 1g.10gb" in body["FailedNodes"]["h100-0"]
    apiserver.add_pod(h100)
    status, bound = await post(http, f"{announced.url}/bind", bind_args("elsewhere", "h100-0"))
    assert "no card in MIG mode for MIG 1g.10gb" in bound["Error"], (status, bound)
    assert apiserver.pod("default", "elsewhere")["spec"].get("nodeName") in (None, "")
