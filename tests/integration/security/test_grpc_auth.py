"""The allocator's gRPC API over mutual TLS: who may call it, and what each caller may touch.

grpclib clients hold the right certificate, another tool's, an admin's, one from another CA,
or none."""

from __future__ import annotations

import asyncio
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError
from nats.aio.client import Client

from gpuledger_common.announce import announce
from gpuledger_common.tls import client_context
from gpuledger_dev.fleet import Fleet
from gpuledger_dev.natsserver import NatsServer
from gpuledger_dev.tlsca import Issued, ThrowawayCa
from gpuledger_proto.gpuledger.allocator import v1 as pb
from tests.support.replicas import RunningAllocator, running_allocator, wait_for

# The server checks the client's certificate after a TLS 1.3 client has finished its side of the
# handshake: the refusal reaches the client as the connection closing under its first call.
REFUSED = (ssl.SSLError, ConnectionError, StreamTerminatedError)


@dataclass
class Pki:
    ca: ThrowawayCa
    tools: dict[str, Issued]
    stranger: Issued  # a certificate from another CA

    def tls(self, who: str) -> ssl.SSLContext:
        issued = self.tools[who]
        return client_context(str(self.ca.cert), str(issued.cert), str(issued.key))


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = ThrowawayCa(tmp_path / "ca")
    tools = {name: ca.issue(name, client=True) for name in ("ci-runner", "other-tool", "admin-1")}
    tools["allocator"] = ca.issue("allocator")
    stranger = ThrowawayCa(tmp_path / "other-ca", "another-ca").issue("ci-runner", client=True)
    return Pki(ca, tools, stranger)


@pytest.fixture
async def api(nats_server: NatsServer, nc: Client, fleet: Fleet, pki: Pki) -> AsyncIterator[RunningAllocator]:
    served = pki.tools["allocator"]
    async with running_allocator(
        nats_server.url,
        client_tls=pki.tls("admin-1"),
        grpc_cert_file=str(served.cert),
        grpc_key_file=str(served.key),
        grpc_client_ca_file=str(pki.ca.cert),
        grpc_admins="admin-1",
    ) as running:
        await announce(nc, [n.node for n in fleet.nodes])
        stub = running.stub()

        async def all_nodes() -> bool:
            return len((await stub.get_cluster(pb.GetClusterRequest())).nodes) == len(fleet.nodes)

        await wait_for(all_nodes, what="fleet in the ledger")
        yield running


def allocate(owner: str, kind: str = "tool") -> pb.AllocateRequest:
    return pb.AllocateRequest(
        owner=pb.Owner(kind=kind, id=owner, namespace="ns" if kind == "pod" else "", name=owner),
        containers=[pb.ContainerRequest(container="main", request=pb.ResourceRequest(gpu=1))],
        commit=True,
    )


async def test_a_caller_without_a_certificate_is_refused(api: RunningAllocator, pki: Pki) -> None:
    only_ca = client_context(str(pki.ca.cert))
    with pytest.raises(REFUSED):
        await api.stub(only_ca).get_cluster(pb.GetClusterRequest())


async def test_a_certificate_from_another_ca_is_refused(api: RunningAllocator, pki: Pki) -> None:
    wrong = client_context(str(pki.ca.cert), str(pki.stranger.cert), str(pki.stranger.key))
    with pytest.raises(REFUSED):
        await api.stub(wrong).get_cluster(pb.GetClusterRequest())


async def test_plaintext_is_refused(api: RunningAllocator) -> None:
    channel = Channel("127.0.0.1", api.settings.grpc_port)
    try:
        with pytest.raises(REFUSED):
            await pb.AllocatorStub(channel, timeout=5.0).get_cluster(pb.GetClusterRequest())
    finally:
        channel.close()


async def test_a_tool_allocates_only_as_itself(api: RunningAllocator, pki: Pki) -> None:
    runner = api.stub(pki.tls("ci-runner"))
    assert (await runner.allocate(allocate("ci-runner"))).allocation.state == "bound"
    assert (await runner.allocate(allocate("ci-runner/job-7"))).allocation.state == "bound"
    for owner, kind in (("other-tool", "tool"), ("ci-runner-x", "tool"), ("pod-uid-1", "pod")):
        with pytest.raises(GRPCError) as refused:
            await runner.allocate(allocate(owner, kind))
        assert refused.value.status is Status.PERMISSION_DENIED, owner
    assert "ci-runner" in (refused.value.message or "")


async def test_a_tool_touches_and_sees_only_its_own_allocations(api: RunningAllocator, pki: Pki) -> None:
    runner, other, admin = (api.stub(pki.tls(who)) for who in ("ci-runner", "other-tool", "admin-1"))
    mine = (await runner.allocate(allocate("ci-runner/job-1"))).allocation
    theirs = (await other.allocate(allocate("other-tool"))).allocation
    for call in (
        other.release(pb.ReleaseRequest(allocation_id=mine.id)),
        other.commit(pb.CommitRequest(allocation_id=mine.id)),
        other.get_allocation(pb.GetAllocationRequest(allocation_id=mine.id)),
    ):
        with pytest.raises(GRPCError) as refused:
            await call
        assert refused.value.status is Status.PERMISSION_DENIED
    listed = (await other.list_allocations(pb.ListAllocationsRequest())).allocations
    assert [a.id for a in listed] == [theirs.id]
    watched = other.watch(pb.WatchRequest()).__aiter__()
    seen = await asyncio.wait_for(_allocation_events(watched, 1), 5.0)
    assert seen == [theirs.id]
    assert (await runner.get_allocation(pb.GetAllocationRequest(allocation_id=mine.id))).id == mine.id
    everything = (await admin.list_allocations(pb.ListAllocationsRequest())).allocations
    assert {a.id for a in everything} >= {mine.id, theirs.id}
    assert (await admin.release(pb.ReleaseRequest(allocation_id=mine.id))).state == "released"
    assert (await other.release(pb.ReleaseRequest(allocation_id=theirs.id))).state == "released"


async def _allocation_events(events: AsyncIterator[pb.LedgerEvent], count: int) -> list[str]:
    """The allocation ids of the first ``count`` allocation events (the snapshot comes first)."""
    ids: list[str] = []
    async for event in events:
        if event.allocation.id:
            ids.append(event.allocation.id)
            if len(ids) == count:
                return ids
    return ids


async def cli(args: list[str]) -> int:
    """``gpuledger`` in a process of its own, as a tool runs it; its exit status. A refusal is
    a message, never a traceback (a refused handshake once was one)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuledger_cli",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 30.0)
    assert b"Traceback" not in err, err.decode()
    assert process.returncode is not None
    return process.returncode


async def test_the_cli_takes_the_same_credentials(api: RunningAllocator, pki: Pki) -> None:
    runner = pki.tools["ci-runner"]
    server = ["--server", api.address, "--json", "--ca-file", str(pki.ca.cert)]
    mine = ["--cert-file", str(runner.cert), "--key-file", str(runner.key)]
    assert await cli(["alloc", *server, *mine, "--owner", "ci-runner/cli"]) == 0
    listed = (await api.stub().list_allocations(pb.ListAllocationsRequest(owner_id="ci-runner/cli"))).allocations
    assert len(listed) == 1
    assert await cli(["release", listed[0].id, *server]) != 0  # no certificate
    other = pki.tools["other-tool"]
    theirs = ["--cert-file", str(other.cert), "--key-file", str(other.key)]
    assert await cli(["release", listed[0].id, *server, *theirs]) != 0
    assert await cli(["release", listed[0].id, *server, *mine]) == 0
