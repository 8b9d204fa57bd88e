"""A tool's MIG request through the allocator's gRPC API, the twin of ``test_mig_tools.py`` (NATS):
the same placement either way, the listing showing the card's mode, instances and holders'
placements, a profile no card model offers refused by field, and the same refusals as over NATS."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grpclib import GRPCError
from grpclib.const import Status
from nats.aio.client import Client

from gpuledger_cli.__main__ import parser
from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.integration.placement.helpers import MIG_NODE, STATIC, mig_node
from tests.support.replicas import RunningAllocator, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
SUBJECT = "gpuledger.v1.allocator"


def tool(owner: str, request: pb.ResourceRequest, node: str = "") -> pb.AllocateRequest:
    return pb.AllocateRequest(
        owner=pb.Owner(kind="tool", id=owner), containers=[pb.ContainerRequest(request=request)], commit=True, node=node
    )


def nats_body(owner: str, **request: object) -> dict[str, object]:
    return {"owner": {"kind": "tool", "id": owner}, "containers": [{"container": "", "request": request}]}


def placed(share: pb.CardShare) -> tuple[int, str, int, int]:
    return share.index, share.mig.profile, share.mig.start, share.mig.size


def placed_json(share: dict[str, Any]) -> tuple[int, str, int, int]:
    return share["index"], share["mig"]["profile"], share["mig"]["start"], share["mig"]["size"]


@pytest.fixture
async def announced(allocator: RunningAllocator, nc: Client) -> pb.AllocatorStub:
    await announce(nc, [mig_node()])
    api = allocator.stub()

    async def known() -> bool:
        cluster = await api.get_cluster(pb.GetClusterRequest())
        return any(n.name == MIG_NODE for n in cluster.nodes)

    await wait_for(known, what="the MIG node in the ledger")
    return api


@pytest.mark.parametrize(
    ("request_", "asked"),
    [
        (pb.ResourceRequest(gpu=1, mig="1g.10gb"), {"count": 1, "mig": "1g.10gb"}),
        (pb.ResourceRequest(gpu=1, mig="smallest", gpu_mem_mib=8000), {"count": 1, "mig": "smallest", "mem_mib": 8000}),
        (pb.ResourceRequest(gpu=1, mig="3g.20gb"), {"count": 1, "mig": "3g.20gb"}),
    ],
)
async def test_a_tool_gets_the_placement_it_gets_over_nats(
    announced: pb.AllocatorStub, nc: Client, request_: pb.ResourceRequest, asked: dict[str, object]
) -> None:
    """Asked over NATS, released, then asked over gRPC on the same ledger: the same instance."""
    api = announced
    over_nats = (await bus.request(nc, f"{SUBJECT}.allocate", nats_body("t-nats", **asked)))["allocation"]
    [[nats_share]] = [g["cards"] for g in over_nats["grants"]]
    await api.release(pb.ReleaseRequest(allocation_id=over_nats["id"]))
    over_grpc = (await api.allocate(tool("t-grpc", request_))).allocation
    [[share]] = [g.cards for g in over_grpc.grants]
    assert (over_grpc.node, placed(share)) == (MIG_NODE, placed_json(nats_share))
    assert (share.mem_mib, share.core_permille, share.exclusive) == (
        nats_share["mem_mib"],
        nats_share["core_milli"],
        False,
    )
    got = await api.get_allocation(pb.GetAllocationRequest(allocation_id=over_grpc.id))
    assert placed(got.grants[0].cards[0]) == placed(share)


async def test_the_listing_shows_the_mode_the_instances_and_who_holds_what(announced: pb.AllocatorStub) -> None:
    api = announced
    static = (await api.allocate(tool("t-static", pb.ResourceRequest(gpu=1, mig="3g.20gb")))).allocation
    small = (await api.allocate(tool("t-small", pb.ResourceRequest(gpu=1, mig="1g.10gb")))).allocation
    assert placed(static.grants[0].cards[0])[1:] == (STATIC.slot.profile, STATIC.slot.start, STATIC.slot.size)
    [node] = (await api.get_cluster(pb.GetClusterRequest(node=MIG_NODE))).nodes
    mig, whole = node.cards
    assert (mig.mode, whole.mode, whole.instances) == ("mig", "whole", [])
    [instance] = mig.instances
    assert (instance.profile, instance.start, instance.size, instance.static, instance.uuid) == (
        "3g.20gb",
        4,
        4,
        True,
        "MIG-static-3g",
    )
    assert instance.allocation_id == static.id
    holders = {h.allocation_id: (h.mig.profile, h.mig.start, h.mig.size) for h in mig.holders}
    assert holders == {static.id: ("3g.20gb", 4, 4), small.id: placed(small.grants[0].cards[0])[1:]}
    assert whole.holders == []


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (pb.ResourceRequest(gpu=1, mig="1g.7gb"), "no card model offers the MIG profile 1g.7gb"),
        (pb.ResourceRequest(gpu=1, mig="smallest"), "needs gpu-mem or gpu-core"),
        (pb.ResourceRequest(gpu=1, mig="1g.10gb", gpu_core_permille=200), "names its memory and compute"),
    ],
)
async def test_a_bad_mig_ask_is_invalid_argument_naming_the_field(
    announced: pb.AllocatorStub, request_: pb.ResourceRequest, named: str
) -> None:
    with pytest.raises(GRPCError) as refused:
        await announced.allocate(tool("t-bad", request_))
    assert refused.value.status is Status.INVALID_ARGUMENT
    message = refused.value.message or ""
    assert message.startswith("containers[0].request.mig: ") and named in message


@pytest.mark.parametrize(
    ("request_", "node", "reason"),
    [
        (pb.ResourceRequest(gpu=1, mig="1g.10gb", models=["H100"]), "", r"no card in MIG mode for MIG 1g.10gb"),
        (pb.ResourceRequest(gpu=2), MIG_NODE, r"1 healthy card(s) of the 2 needed (1 other(s) in MIG mode"),
    ],
)
async def test_the_refusals_are_those_over_nats(
    announced: pb.AllocatorStub, request_: pb.ResourceRequest, node: str, reason: str
) -> None:
    with pytest.raises(GRPCError) as refused:
        await announced.allocate(tool("t-refused", request_, node))
    assert refused.value.status is Status.RESOURCE_EXHAUSTED
    assert reason in (refused.value.message or "")


async def test_the_cli_asks_for_an_instance_and_inspect_lists_it(
    allocator: RunningAllocator, announced: pb.AllocatorStub, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ["--server", allocator.address]
    capsys.readouterr()
    alloc = parser().parse_args(["alloc", "--mig", "3g.20gb", "--owner", "cli-mig", "--json", *server])
    assert await alloc.run(alloc) == 0
    [[share]] = [g["cards"] for g in json.loads(capsys.readouterr().out)["allocation"]["grants"]]
    assert share["mig"] == {"profile": "3g.20gb", "start": 4, "size": 4}
    inspect = parser().parse_args(["inspect", "--node", MIG_NODE, *server])
    assert await inspect.run(inspect) == 0
    [_, mig_line, whole_line, _] = capsys.readouterr().out.splitlines()
    assert "MIG 3g.20gb@4 static: tool:cli-mig (" in mig_line
    assert "MIG" not in whole_line and whole_line.endswith("  -")
    listed = parser().parse_args(["inspect", "--node", MIG_NODE, "--json", *server])
    assert await listed.run(listed) == 0
    [card, _] = json.loads(capsys.readouterr().out)["nodes"][0]["cards"]
    assert [h["mig"] for h in card["holders"]] == [{"profile": "3g.20gb", "start": 4, "size": 4}]
