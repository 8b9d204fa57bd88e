"""A small client of the allocator's gRPC API for the CLI."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError

from gpuledger_common import clusterwire
from gpuledger_common.settings import SettingsError
from gpuledger_common.tls import client_context
from gpuledger_core import errors
from gpuledger_core.status import NodeStatus
from gpuledger_proto.gpuledger.allocator import v1 as pb

FROM_STATUS: dict[Status, type[errors.GpuledgerError]] = {
    Status.NOT_FOUND: errors.NotFound,
    Status.RESOURCE_EXHAUSTED: errors.Exhausted,
    Status.ABORTED: errors.Conflict,
    Status.UNAVAILABLE: errors.Unavailable,
    Status.FAILED_PRECONDITION: errors.FailedPrecondition,
    Status.PERMISSION_DENIED: errors.PermissionDenied,
    Status.UNAUTHENTICATED: errors.PermissionDenied,
}


@dataclass(frozen=True, slots=True)
class ClientTls:
    """Mutual TLS to the allocator: the CA that verifies it, and this tool's certificate (its
    common name is the identity the allocator authorizes by)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def context(self) -> ssl.SSLContext | None:
        if not (self.ca_file or self.cert_file or self.key_file):
            return None
        if not self.ca_file:
            raise errors.InvalidArgument("--ca-file", "is required with --cert-file (it verifies the allocator)")
        if bool(self.cert_file) != bool(self.key_file):
            raise errors.InvalidArgument("--cert-file", "--cert-file and --key-file go together")
        try:
            return client_context(self.ca_file, self.cert_file, self.key_file)
        except SettingsError as err:
            field, _, problem = str(err).partition(": ")
            raise errors.InvalidArgument(field, problem) from None


PLAIN = ClientTls()


def parse_server(server: str) -> tuple[str, int]:
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise errors.InvalidArgument("--server", f"must be HOST:PORT, got {server!r}")
    return host, int(port)


DEFAULT_TIMEOUT_S = 15.0  # the allocator waits out a JetStream election for up to 12 s of it


@contextlib.asynccontextmanager
async def allocator(
    server: str, timeout_s: float = DEFAULT_TIMEOUT_S, tls: ClientTls = PLAIN
) -> AsyncIterator[pb.AllocatorStub]:
    """A stub whose calls have ``timeout_s`` as their gRPC deadline; the allocator answers
    before it (with UNAVAILABLE if the ledger cannot be written by then). ``tls``: mutual TLS."""
    if not timeout_s > 0:
        raise errors.InvalidArgument("--timeout", f"must be a positive number of seconds, got {timeout_s:g}")
    host, port = parse_server(server)
    channel = Channel(host, port, ssl=tls.context())
    try:
        yield pb.AllocatorStub(channel, timeout=timeout_s)
    except GRPCError as err:
        raise from_grpc(err) from err
    except ssl.SSLError as err:
        raise errors.PermissionDenied(f"TLS with the allocator at {server} failed: {err}") from err
    except StreamTerminatedError as err:  # a refused client certificate reaches TLS 1.3 clients so
        raise errors.Unavailable(
            f"the allocator at {server} closed the connection: {err} (does it want a client certificate "
            "from --cert-file/--key-file, or TLS with --ca-file?)"
        ) from err
    except TimeoutError as err:  # grpclib's deadline (an OSError too: first)
        raise errors.Unavailable(f"the allocator at {server} did not answer within {timeout_s:g}s (--timeout)") from err
    except (ConnectionError, OSError) as err:
        raise errors.Unavailable(f"cannot reach the allocator at {server}: {err}") from err
    finally:
        channel.close()


def from_grpc(err: GRPCError) -> errors.GpuledgerError:
    message = err.message or err.status.name
    if err.status is Status.INVALID_ARGUMENT:
        return errors.from_code("invalid_argument", message)
    return FROM_STATUS.get(err.status, errors.GpuledgerError)(message)


GET_CLUSTER = "/gpuledger.allocator.v1.Allocator/GetCluster"


class ClusterPage:
    """A ``Cluster`` reply read by ``clusterwire`` rather than betterproto (2 ms a node): grpclib
    hands a reply's bytes to its type's ``FromString``."""

    def __init__(self, nodes: list[NodeStatus], next_page_token: str) -> None:
        self.nodes, self.next_page_token = nodes, next_page_token

    @classmethod
    def FromString(cls, data: bytes) -> ClusterPage:  # the protobuf name grpclib calls
        return cls(*clusterwire.cluster_from(data))


async def cluster_nodes(
    api: pb.AllocatorStub, node: str = "", model: str = "", page_size: int = 0
) -> list[NodeStatus]:
    """Every node of the cluster, a page per call (each call has the stub's deadline), so a
    listing of thousands of nodes needs no deadline of its own."""
    found: list[NodeStatus] = []
    token = ""
    while True:
        request = pb.GetClusterRequest(node=node, model=model, page_size=page_size, page_token=token)
        reply = await api._unary_unary(GET_CLUSTER, request, ClusterPage)  # the stub's own call, our reader
        found.extend(reply.nodes)
        token = reply.next_page_token
        if not token:
            return found
