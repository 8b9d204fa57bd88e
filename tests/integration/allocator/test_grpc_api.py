"""The allocator's gRPC API against a real nats-server: the happy paths and the bad input."""

from __future__ import annotations

import asyncio

import pytest
from grpclib import GRPCError
from grpclib.const import Status

from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, wait_for


def tool(
    owner: str, request: pb.ResourceRequest, *, node: str = "", commit: bool = True, lease: int = 0
) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id=owner),
        containers=[pb.ContainerRequest(request=request)],
        node=node,
        commit=commit,
        lease_seconds=lease,
    )


async def test_allocate_commit_release_round_trip(allocator: RunningAllocator) -> None:
    api = allocator.stub()
    reply = await api.allocate(tool("t1", pb.ResourceRequest(gpu=1, gpu_mem_mib=4096), node="rtx-0", commit=False))
    a = reply.allocation
    assert (a.state, a.node, reply.existing) == ("reserved", "rtx-0", False)
    assert a.lease_expires_at > a.created_at
    assert [(s.mem_mib, s.exclusive) for s in a.grants[0].cards] == [(4096, False)]

    bound = await api.commit(pb.CommitRequest(allocation_id=a.id))
    assert bound.state == "bound" and bound.lease_expires_at == 0

    cluster = await api.get_cluster(pb.GetClusterRequest(node="rtx-0"))
    card = cluster.nodes[0].cards[0]
    assert card.free_mem_mib == 24259 - 4096
    assert [h.allocation_id for h in card.holders] == [a.id]

    released = await api.release(pb.ReleaseRequest(allocation_id=a.id, reason="done"))
    assert (released.state, released.reason) == ("released", "done")
    again = await api.release(pb.ReleaseRequest(allocation_id=a.id))
    assert again.state == "released"  # idempotent
    cluster = await api.get_cluster(pb.GetClusterRequest(node="rtx-0"))
    assert cluster.nodes[0].cards[0].free_mem_mib == 24259


async def test_same_owner_gets_the_same_allocation(allocator: RunningAllocator) -> None:
    api = allocator.stub()
    first = await api.allocate(tool("retrying", pb.ResourceRequest(gpu=2)))
    second = await api.allocate(tool("retrying", pb.ResourceRequest(gpu=2)))
    assert second.existing and second.allocation.id == first.allocation.id
    listed = await api.list_allocations(pb.ListAllocationsRequest(owner_id="retrying"))
    assert [a.id for a in listed.allocations] == [first.allocation.id]


async def test_concurrent_retries_of_one_owner_make_one_allocation(allocator: RunningAllocator) -> None:
    api = allocator.stub()
    replies = await asyncio.gather(*(api.allocate(tool("storm", pb.ResourceRequest(gpu=1))) for _ in range(8)))
    assert len({r.allocation.id for r in replies}) == 1
    listed = await api.list_allocations(pb.ListAllocationsRequest(owner_id="storm"))
    assert len(listed.allocations) == 1


async def test_exclusive_multi_card_on_one_node(allocator: RunningAllocator) -> None:
    api = allocator.stub()
    reply = await api.allocate(tool("train", pb.ResourceRequest(gpu=4)))
    cards = reply.allocation.grants[0].cards
    assert reply.allocation.node == "h100-0"
    assert len({c.uuid for c in cards}) == 4 and all(c.exclusive and c.core_permille == 1000 for c in cards)


@pytest.mark.parametrize(
    ("request_", "status", "names"),
    [
        (tool("x", pb.ResourceRequest(gpu=0)), Status.INVALID_ARGUMENT, "containers[0].request.gpu"),
        (tool("x", pb.ResourceRequest(gpu=1, gpu_core_permille=1500)), Status.INVALID_ARGUMENT, "gpu-core"),
        (
            pb.AllocateRequest(containers=[pb.ContainerRequest(request=pb.ResourceRequest(gpu=1))]),
            Status.INVALID_ARGUMENT,
            "owner",
        ),
        (pb.AllocateRequest(owner=pb.Owner(kind="robot", id="r")), Status.INVALID_ARGUMENT, "owner.kind"),
        (pb.AllocateRequest(owner=pb.Owner(kind="tool", id="r")), Status.INVALID_ARGUMENT, "containers"),
        (tool("x", pb.ResourceRequest(gpu=9)), Status.RESOURCE_EXHAUSTED, "h100-0: 8 healthy card(s) of the 9 needed"),
        (tool("x", pb.ResourceRequest(gpu=1, gpu_mem_mib=90000)), Status.RESOURCE_EXHAUSTED, "MiB short of 90000 MiB"),
        (tool("x", pb.ResourceRequest(gpu=1, models=["A100"])), Status.RESOURCE_EXHAUSTED, "no card of model A100"),
        (tool("x", pb.ResourceRequest(gpu=1), node="nope"), Status.NOT_FOUND, "node nope"),
        (tool("x", pb.ResourceRequest(gpu=1), lease=999999, commit=False), Status.INVALID_ARGUMENT, "lease_seconds"),
    ],
)
async def test_bad_requests_get_clear_errors(
    allocator: RunningAllocator, request_: pb.AllocateRequest, status: Status, names: str
) -> None:
    api = allocator.stub()
    with pytest.raises(GRPCError) as caught:
        await api.allocate(request_)
    assert caught.value.status is status
    assert names in (caught.value.message or "")
    listed = await api.list_allocations(pb.ListAllocationsRequest(include_released=True))
    assert listed.allocations == []  # nothing half-written


@pytest.mark.parametrize("call", ["get", "commit", "release"])
async def test_unknown_allocation_is_not_found(allocator: RunningAllocator, call: str) -> None:
    api = allocator.stub()
    with pytest.raises(GRPCError) as caught:
        if call == "get":
            await api.get_allocation(pb.GetAllocationRequest(allocation_id="a-missing"))
        elif call == "commit":
            await api.commit(pb.CommitRequest(allocation_id="a-missing"))
        else:
            await api.release(pb.ReleaseRequest(allocation_id="a-missing"))
    assert caught.value.status is Status.NOT_FOUND
    assert "a-missing" in (caught.value.message or "")


async def test_commit_after_release_is_refused(allocator: RunningAllocator) -> None:
    api = allocator.stub()
    a = (await api.allocate(tool("t", pb.ResourceRequest(gpu=1), commit=False))).allocation
    await api.release(pb.ReleaseRequest(allocation_id=a.id))
    with pytest.raises(GRPCError) as caught:
        await api.commit(pb.CommitRequest(allocation_id=a.id))
    assert caught.value.status is Status.FAILED_PRECONDITION


async def test_reservation_expires_after_its_lease(allocator: RunningAllocator) -> None:
    api = allocator.stub()
    a = (await api.allocate(tool("leased", pb.ResourceRequest(gpu=1), node="rtx-0", commit=False, lease=1))).allocation

    async def released() -> bool:
        got = await api.get_allocation(pb.GetAllocationRequest(allocation_id=a.id))
        return bool(got.state == "released" and got.reason == "lease expired")

    await wait_for(released, timeout=10, what="lease expiry")
    cluster = await api.get_cluster(pb.GetClusterRequest(node="rtx-0"))
    assert cluster.nodes[0].cards[0].holders == []
    # the owner may allocate anew once its reservation expired
    again = await api.allocate(tool("leased", pb.ResourceRequest(gpu=1), node="rtx-0"))
    assert not again.existing and again.allocation.id != a.id


async def test_watch_streams_the_ledger_events(allocator: RunningAllocator) -> None:
    api = allocator.stub()
    seen: list[tuple[str, str]] = []
    got_release = asyncio.Event()

    async def follow() -> None:
        async for event in api.watch(pb.WatchRequest(node="p4-0")):
            if event.allocation.id:
                seen.append((event.kind, event.allocation.owner.id))
            if event.kind == "released" and event.allocation.owner.id == "w":
                got_release.set()
                return

    watcher = asyncio.create_task(follow())
    # The watch starts with a snapshot of live allocations, so a marker shows it is following.
    await api.allocate(tool("marker", pb.ResourceRequest(gpu=1, gpu_mem_mib=10), node="p4-0"))

    async def following() -> bool:
        return any(owner == "marker" for _, owner in seen)

    await wait_for(following, what="watch following")
    a = (await api.allocate(tool("w", pb.ResourceRequest(gpu=1, gpu_mem_mib=100), node="p4-0"))).allocation
    await api.release(pb.ReleaseRequest(allocation_id=a.id))
    await asyncio.wait_for(got_release.wait(), 10)
    await watcher
    assert [e for e in seen if e[1] == "w"] == [("reserved", "w"), ("bound", "w"), ("released", "w")]


async def test_inspect_filters_by_model(allocator: RunningAllocator) -> None:
    api = allocator.stub()
    cluster = await api.get_cluster(pb.GetClusterRequest(model="Tesla P4"))
    cards = [(n.name, c.index) for n in cluster.nodes for c in n.cards]
    assert cards == [("p4-0", 0), ("p4-0", 1)]


@pytest.mark.parametrize(("models", "node"), [(["h100"], "h100-0"), (["P4"], "p4-0"), (["RTX 3090", "A100"], "rtx-0")])
async def test_model_selectors_match_whole_words_as_placement_does(
    allocator: RunningAllocator, models: list[str], node: str
) -> None:
    api = allocator.stub()
    reply = await api.allocate(tool(f"m-{node}", pb.ResourceRequest(gpu=1, gpu_mem_mib=100, models=models)))
    assert reply.allocation.node == node


async def test_allocations_are_listed_in_pages(allocator: RunningAllocator) -> None:
    api = allocator.stub()
    made = [(await api.allocate(tool(f"paged-{n}", pb.ResourceRequest(gpu=1)))).allocation for n in range(5)]
    pages, token = [], ""
    while True:
        reply = await api.list_allocations(pb.ListAllocationsRequest(page_size=2, page_token=token))
        pages.append([a.id for a in reply.allocations])
        token = reply.next_page_token
        if not token:
            break
    assert [len(p) for p in pages] == [2, 2, 1]
    listed = [i for p in pages for i in p]
    by_place = sorted(made, key=lambda a: (a.node, a.id))
    assert listed == [a.id for a in by_place]  # each once, by node and ID
    with pytest.raises(GRPCError) as caught:
        await api.list_allocations(pb.ListAllocationsRequest(page_token="not-a-token"))
    assert caught.value.status is Status.INVALID_ARGUMENT
    assert "page_token" in (caught.value.message or "")
