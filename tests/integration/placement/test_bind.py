"""Bind end to end: a real nats-server and ledger, the fake kube-apiserver, the real client."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client

from gpuledger_common.announce import announce
from gpuledger_common.store import LedgerStore
from gpuledger_core import codec
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, AllocState, Owner, OwnerKind
from gpuledger_core.slots import card_of
from gpuledger_dev.fake_apiserver import FakeApiServer
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import (
    RunningAllocator,
    RunningPlacement,
    running_allocator,
    running_placement,
    wait_for,
)

from .helpers import args, bind_args, gpu_pod, post

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
async def store(nc: Client) -> LedgerStore:
    return await LedgerStore.open(nc)


async def live_of(store: LedgerStore, node: str, uid: str) -> list[Allocation]:
    ledger, _ = await store.read(node)
    assert isinstance(ledger, NodeLedger)
    return [a for a in ledger.allocations if a.live and a.owner.id == uid]


def pod_owner(name: str) -> Owner:
    return Owner(OwnerKind.POD, f"uid-{name}", "default", name)


async def test_bind_reserves_with_device_ids_annotates_and_binds(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    apiserver.add_pod(gpu_pod("train", gpu=2, mem=30000, annotations={"gpuledger.io/isolation": "mps"}))
    status, body = await post(http, f"{placement.url}/bind", bind_args("train", "h100-0"))
    assert (status, body) == (200, {"Error": ""})

    pod = apiserver.pod("default", "train")
    assert pod["spec"]["nodeName"] == "h100-0"
    assert len(apiserver.bindings) == 1
    binding = apiserver.bindings[0]
    assert binding["kind"] == "Binding"
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "h100-0"}
    assert binding["metadata"]["uid"] == "uid-train"
    mirrored = codec.allocation_from(
        codec.Reader(json.loads(pod["metadata"]["annotations"]["gpuledger.io/allocation"]))
    )

    [held] = await live_of(store, "h100-0", "uid-train")
    assert held == mirrored
    assert held.state is AllocState.RESERVED and held.lease_expires_at is not None
    assert held.isolation.value == "mps"
    [grant] = held.grants
    assert grant.container == "main" and len(grant.cards) == 2
    assert [s.mem_mib for s in grant.cards] == [30000, 30000]
    assert len(grant.device_ids) == 2
    assert [card_of(i) for i in grant.device_ids] == [s.uuid for s in grant.cards]
    record = await store.owner_of(pod_owner("train"))
    assert record is not None and record[0] == held.id and record[1] == "h100-0"


async def test_a_retried_bind_is_idempotent(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    apiserver.add_pod(gpu_pod("infer", gpu=1, mem=4000))
    first = await post(http, f"{placement.url}/bind", bind_args("infer", "h100-0"))
    again = await post(http, f"{placement.url}/bind", bind_args("infer", "h100-0"))
    assert first == again == (200, {"Error": ""})
    assert len(apiserver.bindings) == 1
    assert len(await live_of(store, "h100-0", "uid-infer")) == 1


async def test_bind_refuses_a_pod_of_another_scheduler_and_reserves_nothing(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    pod = gpu_pod("theirs", gpu=1)
    pod["spec"]["schedulerName"] = "default-scheduler"
    apiserver.add_pod(pod)
    status, body = await post(http, f"{placement.url}/bind", bind_args("theirs", "h100-0"))
    assert status == 200
    assert "names scheduler 'default-scheduler'; this extender binds only pods of gpuledger-scheduler" in body["Error"]
    assert apiserver.bindings == []
    assert await live_of(store, "h100-0", "uid-theirs") == []


async def test_over_plain_http_a_filter_body_never_stands_in_for_the_pod_at_bind(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    """Plain HTTP identifies no caller, so a filter's copy of the pod is not the scheduler's word:
    a copy that names gpuledger-scheduler for a pod of another scheduler is read afresh at bind."""
    pod = gpu_pod("forged", gpu=1)
    pod["spec"]["schedulerName"] = "default-scheduler"
    apiserver.add_pod(pod)
    status, found = await post(http, f"{placement.url}/filter", args(gpu_pod("forged", gpu=1), ["h100-0"]))
    assert (status, found["NodeNames"]) == (200, ["h100-0"])
    status, body = await post(http, f"{placement.url}/bind", bind_args("forged", "h100-0"))
    assert status == 200 and "names scheduler 'default-scheduler'" in body["Error"]
    assert apiserver.bindings == []
    assert await live_of(store, "h100-0", "uid-forged") == []


async def test_bind_refuses_a_pod_someone_else_bound_and_gives_it_no_card(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    pod = gpu_pod("elsewhere", gpu=1)
    pod["spec"]["nodeName"] = "h100-0"  # bound at creation, by whoever created it
    apiserver.add_pod(pod)
    status, body = await post(http, f"{placement.url}/bind", bind_args("elsewhere", "h100-0"))
    assert status == 200
    assert "bound to h100-0 already, without a gpuledger reservation" in body["Error"]
    assert await live_of(store, "h100-0", "uid-elsewhere") == []
    assert await store.owner_of(pod_owner("elsewhere")) is None


async def test_a_failed_binding_rolls_the_reservation_back(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    apiserver.add_pod(gpu_pod("denied", gpu=1))
    apiserver.fail_bindings.append((403, 'pods "denied" is forbidden: cannot create resource "pods/binding"'))
    status, body = await post(http, f"{placement.url}/bind", bind_args("denied", "h100-0"))
    assert status == 200
    assert "forbidden" in body["Error"]

    pod = apiserver.pod("default", "denied")
    assert not pod["spec"].get("nodeName")
    assert "gpuledger.io/allocation" not in pod["metadata"]["annotations"]
    assert await live_of(store, "h100-0", "uid-denied") == []
    assert await store.owner_of(pod_owner("denied")) is None
    ledger, _ = await store.read("h100-0")
    assert ledger is not None
    [released] = [a for a in ledger.allocations if a.owner.id == "uid-denied"]
    assert "bind failed" in released.reason

    # The scheduler retries; this time the API server lets it through.
    assert await post(http, f"{placement.url}/bind", bind_args("denied", "h100-0")) == (200, {"Error": ""})
    assert len(await live_of(store, "h100-0", "uid-denied")) == 1


async def test_an_unanswered_binding_keeps_the_reservation_for_the_retry(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    apiserver.add_pod(gpu_pod("slow", gpu=1))
    apiserver.fail_bindings.append((503, "etcdserver: request timed out"))
    _, body = await post(http, f"{placement.url}/bind", bind_args("slow", "h100-0"))
    assert "timed out" in body["Error"]
    [kept] = await live_of(store, "h100-0", "uid-slow")  # the outcome was unknown: the lease decides

    assert await post(http, f"{placement.url}/bind", bind_args("slow", "h100-0")) == (200, {"Error": ""})
    assert [a.id for a in await live_of(store, "h100-0", "uid-slow")] == [kept.id]


async def test_a_retry_after_the_kept_reservations_lease_ran_out_reserves_anew(
    nats_server: NatsServer,
    nc: Client,
    fleet: Fleet,
    apiserver: FakeApiServer,
    store: LedgerStore,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    # The reservation kept for the retry lapses before the retry comes, and no write to its node
    # has released it yet (the allocator's sweep is far off): the retry does not bind the pod with
    # it (kubelet would find it released), it reserves anew.
    config = apiserver.kubeconfig(tmp_path / "kubeconfig")
    async with contextlib.AsyncExitStack() as stack:
        allocator = await stack.enter_async_context(running_allocator(nats_server.url, sweep_interval_s=3600.0))
        await announce(nc, [n.node for n in fleet.nodes])

        async def all_nodes() -> bool:
            return len((await allocator.stub().get_cluster(pb.GetClusterRequest())).nodes) == len(fleet.nodes)

        await wait_for(all_nodes, what="fleet in the ledger")
        short = await stack.enter_async_context(
            running_placement(nats_server.url, kube="kubeconfig", kubeconfig=str(config), lease_s=1.0)
        )
        apiserver.add_pod(gpu_pod("late", gpu=1))
        apiserver.fail_bindings.append((503, "etcdserver: request timed out"))
        _, body = await post(http, f"{short.url}/bind", bind_args("late", "h100-0"))
        assert "timed out" in body["Error"]
        [lapsed] = await live_of(store, "h100-0", "uid-late")
        await asyncio.sleep(1.2)
        assert [a.id for a in await live_of(store, "h100-0", "uid-late")] == [lapsed.id]  # not released yet

        assert await post(http, f"{short.url}/bind", bind_args("late", "h100-0")) == (200, {"Error": ""})
        [now] = await live_of(store, "h100-0", "uid-late")
        assert now.id != lapsed.id
        ledger, _ = await store.read("h100-0")
        gone = ledger.get(lapsed.id) if ledger is not None else None
        assert gone is not None and gone.reason == "lease expired"
        annotation = apiserver.pod("default", "late")["metadata"]["annotations"]["gpuledger.io/allocation"]
        assert json.loads(annotation)["id"] == now.id


async def test_a_refiltered_retry_keeps_the_reservation_it_already_holds(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    # The first Binding's outcome is unknown, so its reservation stays; the scheduler filters the
    # pod again (a new assumption, on other cards) and binds: the pod keeps the one it holds.
    apiserver.add_pod(gpu_pod("twice", gpu=1))
    _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("twice", gpu=1), ["h100-0"]))
    assert body["NodeNames"] == ["h100-0"]
    apiserver.fail_bindings.append((503, "etcdserver: request timed out"))
    _, body = await post(http, f"{placement.url}/bind", bind_args("twice", "h100-0"))
    assert "timed out" in body["Error"]
    [kept] = await live_of(store, "h100-0", "uid-twice")

    _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("twice", gpu=1), ["h100-0"]))
    assert body["NodeNames"] == ["h100-0"]
    assert await post(http, f"{placement.url}/bind", bind_args("twice", "h100-0")) == (200, {"Error": ""})
    assert [a.id for a in await live_of(store, "h100-0", "uid-twice")] == [kept.id]
    record = await store.owner_of(pod_owner("twice"))
    assert record is not None and record[0] == kept.id
    annotation = apiserver.pod("default", "twice")["metadata"]["annotations"]["gpuledger.io/allocation"]
    assert json.loads(annotation)["id"] == kept.id


async def test_a_pod_whose_own_reservation_fills_the_node_is_sent_back_to_it(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    # p4-0 has two cards. "first" reserves one, but its Binding's outcome is unknown (placement
    # could as well have died there); "second" takes the other. When the scheduler retries "first",
    # the node is full only because of first's own reservation: it is sent back to it, and its
    # bind keeps that reservation.
    for name in ("first", "second"):
        apiserver.add_pod(gpu_pod(name, gpu=1))
    _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("first", gpu=1), ["p4-0"]))
    assert body["NodeNames"] == ["p4-0"]
    apiserver.fail_bindings.append((503, "etcdserver: request timed out"))
    _, body = await post(http, f"{placement.url}/bind", bind_args("first", "p4-0"))
    assert "timed out" in body["Error"]
    [kept] = await live_of(store, "p4-0", "uid-first")
    _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("second", gpu=1), ["p4-0"]))
    assert body["NodeNames"] == ["p4-0"]
    assert await post(http, f"{placement.url}/bind", bind_args("second", "p4-0")) == (200, {"Error": ""})

    _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("first", gpu=1), ["p4-0"]))
    assert body["NodeNames"] == ["p4-0"], body
    assert await post(http, f"{placement.url}/bind", bind_args("first", "p4-0")) == (200, {"Error": ""})
    assert [a.id for a in await live_of(store, "p4-0", "uid-first")] == [kept.id]
    _, body = await post(http, f"{placement.url}/filter", args(gpu_pod("third", gpu=1), ["p4-0"]))
    assert body["NodeNames"] == [] and "p4-0" in body["FailedNodes"]  # full for anyone else


async def test_bind_refuses_a_recreated_pod_and_a_missing_one(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    apiserver.add_pod(gpu_pod("again", gpu=1, uid="uid-new"))
    _, body = await post(http, f"{placement.url}/bind", bind_args("again", "h100-0", uid="uid-old"))
    assert "recreated" in body["Error"]
    _, body = await post(http, f"{placement.url}/bind", bind_args("ghost", "h100-0"))
    assert 'pods "ghost" not found' in body["Error"]
    assert apiserver.bindings == []
    assert await live_of(store, "h100-0", "uid-new") == []


async def test_bind_to_a_node_without_room_fails_and_leaves_nothing(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    apiserver.add_pod(gpu_pod("huge", gpu=2, mem=20000))
    _, body = await post(http, f"{placement.url}/bind", bind_args("huge", "p4-0"))
    assert "20000 MiB" in body["Error"]
    assert apiserver.bindings == [] and not apiserver.pod("default", "huge")["spec"].get("nodeName")
    assert await live_of(store, "p4-0", "uid-huge") == []


@pytest.fixture
async def second_placement(
    nats_server: NatsServer, allocator: RunningAllocator, apiserver: FakeApiServer, tmp_path: Path
) -> AsyncIterator[RunningPlacement]:
    config = apiserver.kubeconfig(tmp_path / "kubeconfig-2")
    async with running_placement(nats_server.url, kube="kubeconfig", kubeconfig=str(config)) as running:
        yield running


async def test_two_replicas_racing_for_the_last_room_one_wins(
    placement: RunningPlacement,
    second_placement: RunningPlacement,
    apiserver: FakeApiServer,
    store: LedgerStore,
    http: aiohttp.ClientSession,
) -> None:
    # p4-0 has two cards: each pod wants both, whole. Only one can have them.
    for name in ("left", "right"):
        apiserver.add_pod(gpu_pod(name, gpu=2))
    left, right = await asyncio.gather(
        post(http, f"{placement.url}/bind", bind_args("left", "p4-0")),
        post(http, f"{second_placement.url}/bind", bind_args("right", "p4-0")),
    )
    errors = sorted([left[1]["Error"], right[1]["Error"]])
    assert errors[0] == ""
    assert "free whole card(s) of the 2 needed" in errors[1]
    assert len(apiserver.bindings) == 1
    winner = apiserver.bindings[0]["metadata"]["name"]
    loser = "right" if winner == "left" else "left"
    assert len(await live_of(store, "p4-0", f"uid-{winner}")) == 1
    assert await live_of(store, "p4-0", f"uid-{loser}") == []
    assert not apiserver.pod("default", loser)["spec"].get("nodeName")


async def test_a_bound_pod_is_what_the_allocator_reports(
    placement: RunningPlacement,
    allocator: RunningAllocator,
    apiserver: FakeApiServer,
    http: aiohttp.ClientSession,
) -> None:
    apiserver.add_pod(gpu_pod("seen", gpu=1, core=50))
    assert await post(http, f"{placement.url}/bind", bind_args("seen", "rtx-0")) == (200, {"Error": ""})
    stub = allocator.stub()

    async def listed() -> bool:
        reply = await stub.list_allocations(pb.ListAllocationsRequest(node="rtx-0"))
        return any(a.owner.id == "uid-seen" for a in reply.allocations)

    await wait_for(listed, what="the allocator to see the pod's reservation")


async def test_a_bind_takes_the_cards_filter_chose_whatever_order_the_binds_land_in(
    placement: RunningPlacement, apiserver: FakeApiServer, store: LedgerStore, http: aiohttp.ClientSession
) -> None:
    # Both pods are filtered onto p4-0 (two cards) before either bind: "first" is given card 0,
    # "second" card 1. The second bind lands first and still takes card 1, leaving card 0 to the
    # first; re-planned on the ledger alone it would have taken card 0.
    for name in ("first", "second"):
        apiserver.add_pod(gpu_pod(name, gpu=1))
        _, body = await post(http, f"{placement.url}/filter", args(gpu_pod(name, gpu=1), ["p4-0"]))
        assert body["NodeNames"] == ["p4-0"]
    assert await post(http, f"{placement.url}/bind", bind_args("second", "p4-0")) == (200, {"Error": ""})
    assert await post(http, f"{placement.url}/bind", bind_args("first", "p4-0")) == (200, {"Error": ""})
    cards = {}
    for name in ("first", "second"):
        [held] = await live_of(store, "p4-0", f"uid-{name}")
        cards[name] = [s.index for s in held.shares()]
    assert cards == {"first": [0], "second": [1]}
