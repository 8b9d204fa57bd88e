"""GetCluster answers a page at a time, and ``gpuledger inspect`` reads every page."""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client

from gpuledger_cli.__main__ import parser
from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_core.errors import InvalidArgument
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import running_allocator, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
NODES = 7


async def test_pages_cover_every_node_once_in_order_and_inspect_reads_them_all(
    nats_server: NatsServer, nc: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: n{i}\n    profile: tesla-p4-2\n" for i in range(NODES)))
    names = sorted(n.node.name for n in fleet.nodes)
    async with running_allocator(nats_server.url) as running:
        await announce(nc, [n.node for n in fleet.nodes])
        stub = running.stub()

        async def loaded() -> bool:
            return len((await stub.get_cluster(pb.GetClusterRequest(page_size=NODES))).nodes) == NODES

        await wait_for(loaded, what="fleet in the ledger")
        pages: list[list[str]] = []
        token = ""
        while True:
            reply = await stub.get_cluster(pb.GetClusterRequest(page_size=3, page_token=token))
            pages.append([n.name for n in reply.nodes])
            token = reply.next_page_token
            if not token:
                break
        assert pages == [names[0:3], names[3:6], names[6:7]]
        whole = await stub.get_cluster(pb.GetClusterRequest())  # the default page holds them all
        assert ([n.name for n in whole.nodes], whole.next_page_token) == (names, "")
        one = await stub.get_cluster(pb.GetClusterRequest(node="n4", page_size=1))
        assert ([n.name for n in one.nodes], one.next_page_token) == (["n4"], "")

        subject = "gpuledger.v1.allocator.cluster"
        first = await bus.request(nc, subject, {"page_size": 4})
        rest = await bus.request(nc, subject, {"page_size": 4, "page_token": first["next_page_token"]})
        assert [n["name"] for n in first["nodes"] + rest["nodes"]] == names
        assert rest["next_page_token"] == ""
        with pytest.raises(InvalidArgument, match="page_size"):
            await bus.request(nc, subject, {"page_size": -1})

        capsys.readouterr()
        args = parser().parse_args(["inspect", "--json", "--page-size", "2", "--server", running.address])
        assert await args.run(args) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [n["name"] for n in listed["nodes"]] == names
        bad = parser().parse_args(["inspect", "--page-size", "0", "--server", running.address])
        with pytest.raises(InvalidArgument, match="--page-size"):
            await args.run(bad)
