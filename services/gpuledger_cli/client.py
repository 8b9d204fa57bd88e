"""A small client of the allocator's gRPC API for the CLI."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

from gpuledger_core import errors
from gpuledger_proto.gpuledger.allocator import v1 as pb

FROM_STATUS: dict[Status, type[errors.GpuledgerError]] = {
    Status.NOT_FOUND: errors.NotFound,
    Status.RESOURCE_EXHAUSTED: errors.Exhausted,
    Status.ABORTED: errors.Conflict,
    Status.UNAVAILABLE: errors.Unavailable,
    Status.FAILED_PRECONDITION: errors.FailedPrecondition,
}


def parse_server(server: str) -> tuple[str, int]:
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise errors.InvalidArgument("--server", f"must be HOST:PORT, got {server!r}")
    return host, int(port)


DEFAULT_TIMEOUT_S = 15.0  # the allocator waits out a JetStream election for up to 12 s of it


@contextlib.asynccontextmanager
async def allocator(server: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> AsyncIterator[pb.AllocatorStub]:
    """A stub whose calls have ``timeout_s`` as their gRPC deadline; the allocator answers
    before it (with UNAVAILABLE if the ledger cannot be written by then)."""
    if not timeout_s > 0:
        raise errors.InvalidArgument("--timeout", f"must be a positive number of seconds, got {timeout_s:g}")
    host, port = parse_server(server)
    channel = Channel(host, port)
    try:
        yield pb.AllocatorStub(channel, timeout=timeout_s)
    except GRPCError as err:
        raise from_grpc(err) from err
    except (ConnectionError, OSError) as err:
        raise errors.Unavailable(f"cannot reach the allocator at {server}: {err}") from err
    finally:
        channel.close()


def from_grpc(err: GRPCError) -> errors.GpuledgerError:
    message = err.message or err.status.name
    if err.status is Status.INVALID_ARGUMENT:
        return errors.from_code("invalid_argument", message)
    return FROM_STATUS.get(err.status, errors.GpuledgerError)(message)
