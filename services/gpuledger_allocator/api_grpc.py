"""The external gRPC API ``gpuledger.allocator.v1.Allocator`` (grpclib + betterproto)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from grpclib import GRPCError
from grpclib.const import Handler, Status

from gpuledger_allocator import callers
from gpuledger_allocator.callers import ANYONE, Caller
from gpuledger_allocator.queries import AllocationFilter, allocations_page, cluster_page
from gpuledger_allocator.reserving import AllocateCall
from gpuledger_allocator.service import AllocatorService
from gpuledger_common import clusterwire
from gpuledger_common import pbconvert as conv
from gpuledger_common.bus import answering
from gpuledger_common.store.outage import within
from gpuledger_common.tls import identity_of
from gpuledger_core import errors
from gpuledger_core.events import LedgerEvent
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.model import Allocation, Isolation
from gpuledger_core.status import NodeStatus
from gpuledger_proto.gpuledger.allocator import v1 as pb

log = logging.getLogger(__name__)
T = TypeVar("T")
ENCODE_SLICE = 50  # nodes of a cluster page encoded per turn of the event loop (about 2.5 ms, none kept)
ANSWER_S = 1.0  # of a caller's deadline, kept for answering after the ledger's outage window

STATUS = {
    errors.InvalidArgument: Status.INVALID_ARGUMENT,
    errors.NotFound: Status.NOT_FOUND,
    errors.Exhausted: Status.RESOURCE_EXHAUSTED,
    errors.Conflict: Status.ABORTED,
    errors.Unavailable: Status.UNAVAILABLE,
    errors.FailedPrecondition: Status.FAILED_PRECONDITION,
    errors.PermissionDenied: Status.PERMISSION_DENIED,
}


def to_grpc(err: errors.GpuledgerError) -> GRPCError:
    status = next((STATUS[kind] for kind in type(err).__mro__ if kind in STATUS), Status.INTERNAL)
    return GRPCError(status, str(err))


async def _call(work: Callable[[], Awaitable[T]]) -> T:
    try:
        return await work()
    except errors.GpuledgerError as err:
        raise to_grpc(err) from err


def _id(value: str) -> AllocationId:
    if not value:
        raise errors.InvalidArgument("allocation_id", "must not be empty")
    return AllocationId(value)


class AllocatorApi(pb.AllocatorBase):  # type: ignore[misc]
    """The API; with ``tls`` (mutual TLS: every caller has a verified certificate) each call
    runs as its caller (``callers``), an admin if its identity is one of ``admins``."""

    def __init__(self, service: AllocatorService, *, tls: bool = False, admins: frozenset[str] = frozenset()) -> None:
        self.service, self.tls, self.admins = service, tls, admins

    def __mapping__(self) -> dict[str, Handler]:
        """The generated handlers, each run as its caller and waiting out a ledger outage only
        until ``ANSWER_S`` before the caller's deadline, so the caller hears why rather than
        DEADLINE_EXCEEDED."""
        mapping: dict[str, Handler] = super().__mapping__()
        wrapped = {
            path: handler._replace(func=self._as_caller(_before_deadline(handler.func)))
            for path, handler in mapping.items()
        }
        allocate = wrapped[ALLOCATE_PATH]
        wrapped[ALLOCATE_PATH] = allocate._replace(request_type=RawAllocateRequest)
        return wrapped

    def caller_of(self, peercert: dict[str, Any] | None) -> Caller:
        if not self.tls:
            return ANYONE
        identity = identity_of(peercert)
        return Caller(identity, admin=identity in self.admins)

    def _as_caller(self, func: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        async def handle(stream: Any) -> None:
            caller = self.caller_of(stream.peer.cert())
            if not caller.identity and self.tls:  # the handshake requires a certificate: never here
                raise GRPCError(Status.UNAUTHENTICATED, "a client certificate is required")
            token = callers.current.set(caller)
            try:
                with answering():  # the ledger's events wait for the answer (sent by ``func``)
                    await func(stream)
            finally:
                callers.current.reset(token)

        return handle

    async def _owned(self, allocation_id: AllocationId, action: str) -> None:
        """Refuse ``action`` on an allocation the caller does not own (it must exist to say)."""
        caller = callers.current.get()
        if not caller.admin:
            caller.check((await self.service.get(allocation_id)).owner, action)

    async def allocate(self, allocate_request: pb.AllocateRequest | RawAllocateRequest) -> pb.AllocateResponse:
        """Served with the request's bytes read by ``clusterwire`` (``RawAllocateRequest``;
        betterproto took about 0.23 ms to read one); a message given in-process is read the same way."""

        async def work() -> pb.AllocateResponse:
            wire = (
                allocate_request.wire if isinstance(allocate_request, RawAllocateRequest) else bytes(allocate_request)
            )
            r = clusterwire.allocate_request_from(wire)
            call = AllocateCall(
                owner=r.owner,
                asks=r.asks,
                isolation=_isolation(r.isolation),
                lease_s=float(r.lease_seconds) or None,
                commit=r.commit,
                node=NodeName(r.node) if r.node else None,
            )
            callers.current.get().check(call.owner, "allocate")
            allocation, existing = await self.service.allocate(call)
            return EncodedAllocateResponse(clusterwire.allocate_response_bytes(allocation, existing))

        return await _call(work)

    async def commit(self, commit_request: pb.CommitRequest) -> pb.Allocation:
        return await _call(lambda: self._commit(commit_request.allocation_id))

    async def _commit(self, allocation_id: str) -> pb.Allocation:
        await self._owned(_id(allocation_id), "commit")
        return _encoded(await self.service.commit(_id(allocation_id)))

    async def release(self, release_request: pb.ReleaseRequest) -> pb.Allocation:
        async def work() -> pb.Allocation:
            reason = release_request.reason or "released"
            await self._owned(_id(release_request.allocation_id), "release")
            return _encoded(await self.service.release(_id(release_request.allocation_id), reason))

        return await _call(work)

    async def get_allocation(self, get_allocation_request: pb.GetAllocationRequest) -> pb.Allocation:
        async def work() -> pb.Allocation:
            allocation = await self.service.get(_id(get_allocation_request.allocation_id))
            callers.current.get().check(allocation.owner, "read")
            return _encoded(allocation)

        return await _call(work)

    async def list_allocations(self, list_allocations_request: pb.ListAllocationsRequest) -> pb.ListAllocationsResponse:
        """One page (``page_size``, ``page_token``) of the allocations the caller may see, by node
        and allocation ID, encoded by ``clusterwire``."""
        r = list_allocations_request
        where = AllocationFilter(r.node, r.owner_kind, r.owner_id, r.namespace, r.include_released)
        caller = callers.current.get()
        try:
            found, next_token = allocations_page(self.service.view, where, r.page_size, r.page_token, caller.sees)
        except errors.InvalidArgument as err:
            raise to_grpc(err) from err
        return EncodedAllocations(await _encode_allocations(found, next_token))

    async def get_cluster(self, get_cluster_request: pb.GetClusterRequest) -> pb.Cluster:
        """One page of the cluster (``page_size``, ``page_token``), encoded by ``clusterwire``
        (betterproto took about 2 ms a node) a slice of nodes per turn of the event loop, so
        Allocates go on between slices; a node's cards stay encoded while they are unchanged."""
        r = get_cluster_request
        nodes, next_token = cluster_page(self.service.view, r.node, r.model, r.page_size, r.page_token)
        if r.node and not nodes:
            raise GRPCError(Status.NOT_FOUND, f"node {r.node} is not in the ledger")
        return EncodedCluster(await _encode_cluster(nodes, next_token))

    async def watch(self, watch_request: pb.WatchRequest) -> AsyncIterator[pb.LedgerEvent]:
        """Events of the caller's allocations (an admin's: all) and of the nodes."""
        caller = callers.current.get()

        def shown(event: LedgerEvent) -> bool:
            mine = event.allocation is None or caller.sees(event.allocation)
            return mine and (not watch_request.node or event.node == watch_request.node)

        queue = self.service.view.subscribe()
        try:
            for past in self.service.view.snapshot_events():
                if shown(past):
                    yield conv.event_to(past)
            while True:
                event = await queue.get()
                if event is None:
                    raise GRPCError(Status.RESOURCE_EXHAUSTED, "the watcher fell behind; watch again")
                if shown(event):
                    yield conv.event_to(event)
        finally:
            self.service.view.unsubscribe(queue)


def _before_deadline(func: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    async def handle(stream: Any) -> None:
        if stream.deadline is None:
            await func(stream)
            return
        with within(stream.deadline.time_remaining() - ANSWER_S):
            await func(stream)

    return handle


def _isolation(value: str) -> Isolation:
    try:
        return Isolation(value or "none")
    except ValueError:
        raise errors.InvalidArgument("isolation", f"must be none or mps, got {value!r}") from None


ALLOCATE_PATH = "/gpuledger.allocator.v1.Allocator/Allocate"


class RawAllocateRequest:
    """An ``AllocateRequest`` as it came: grpclib's codec makes it with ``FromString``, and
    ``allocate`` reads it (a bad one is then refused as INVALID_ARGUMENT naming the field)."""

    __slots__ = ("wire",)

    def __init__(self, wire: bytes) -> None:
        self.wire = wire

    @classmethod
    def FromString(cls, data: bytes) -> RawAllocateRequest:  # the protobuf name grpclib calls
        return cls(bytes(data))


class Encoded:
    """A reply message already encoded (``clusterwire``): grpclib sends these bytes as they are.
    It is an instance of the reply's class for grpclib's type check, and nothing of betterproto's
    runs for it: betterproto's set-up of a subclass reads the field types in this module, where
    the proto's names are not (or are the core's), and failed for ``Allocation`` in a process
    that had not used the proto's own class first."""

    _wire: bytes

    def __init__(self, wire: bytes) -> None:
        object.__setattr__(self, "_wire", wire)

    def SerializeToString(self) -> bytes:  # the protobuf name grpclib calls
        return self._wire


class EncodedCluster(Encoded, pb.Cluster):  # type: ignore[misc]
    pass


class EncodedAllocations(Encoded, pb.ListAllocationsResponse):  # type: ignore[misc]
    pass


class EncodedAllocation(Encoded, pb.Allocation):  # type: ignore[misc]
    pass


class EncodedAllocateResponse(Encoded, pb.AllocateResponse):  # type: ignore[misc]
    pass


def _encoded(allocation: Allocation) -> EncodedAllocation:
    """One allocation's reply (betterproto took about 0.45 ms to convert and encode one)."""
    return EncodedAllocation(clusterwire.allocation_bytes(allocation))


async def _in_slices(items: Sequence[T], size: int, write: Callable[[Sequence[T]], bytes]) -> bytes:
    """``write`` over ``items`` ``size`` at a time, a slice per turn of the event loop (runs of a
    repeated field joined are one message)."""
    parts = []
    for start in range(0, len(items), size):
        if start:
            await asyncio.sleep(0)
        parts.append(write(items[start : start + size]))
    return b"".join(parts)


async def _encode_allocations(allocations: list[Allocation], next_token: str) -> bytes:
    """The page as a ``ListAllocationsResponse``'s bytes, ``ENCODE_SLICE * 10`` allocations per
    turn of the loop (betterproto took about 0.45 ms each, all in one turn)."""
    encoded = await _in_slices(allocations, ENCODE_SLICE * 10, clusterwire.allocations_bytes)
    return encoded + clusterwire.allocations_bytes((), next_token)


async def _encode_cluster(nodes: list[NodeStatus], next_token: str) -> bytes:
    """The page as a ``Cluster`` message's bytes, ``ENCODE_SLICE`` nodes per turn of the loop."""
    return await _in_slices(nodes, ENCODE_SLICE, clusterwire.cluster_bytes) + clusterwire.cluster_bytes((), next_token)
