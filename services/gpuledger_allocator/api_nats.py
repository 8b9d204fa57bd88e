"""The allocator's internal API over NATS request/reply (subjects in docs/nats-api.md)."""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client

from gpuledger_allocator import wire
from gpuledger_allocator.queries import AllocationFilter, allocations_page, cluster_page
from gpuledger_allocator.service import AllocatorService
from gpuledger_common.bus import SUBJECT_PREFIX, Handler, Responder
from gpuledger_core import codec, codec_status
from gpuledger_core.codec import Reader
from gpuledger_core.errors import InvalidArgument, NotFound

PREFIX = f"{SUBJECT_PREFIX}.allocator"
QUEUE = "allocator"


def handlers(service: AllocatorService) -> dict[str, Handler]:
    async def allocate(body: Any) -> Any:
        allocation, existing = await service.allocate(wire.allocate_call_from(body))
        return wire.allocated(allocation, existing)

    async def commit(body: Any) -> Any:
        return {"allocation": codec.allocation_to(await service.commit(wire.allocation_id_from(body)))}

    async def release(body: Any) -> Any:
        reason = Reader(body).text("reason", "released") or "released"
        released = await service.release(wire.allocation_id_from(body), reason)
        return {"allocation": codec.allocation_to(released)}

    async def get(body: Any) -> Any:
        return {"allocation": codec.allocation_to(await service.get(wire.allocation_id_from(body)))}

    async def listing(body: Any) -> Any:
        r = Reader(body)
        where = AllocationFilter(
            r.text("node", ""),
            r.text("owner_kind", ""),
            r.text("owner_id", ""),
            r.text("namespace", ""),
            r.flag("include_released"),
        )
        found, next_token = allocations_page(service.view, where, r.integer("page_size", 0), r.text("page_token", ""))
        return {"allocations": [codec.allocation_to(a) for a in found], "next_page_token": next_token}

    async def cluster_status(body: Any) -> Any:
        r = Reader(body)
        node = r.text("node", "")
        page_size, after = r.integer("page_size", 0), r.text("page_token", "")
        if page_size < 0:
            raise InvalidArgument("page_size", f"must be 0 (the default page) or more, got {page_size}")
        nodes, next_token = cluster_page(service.view, node, r.text("model", ""), page_size, after)
        if node and not nodes:
            raise NotFound(f"node {node} is not in the ledger")
        return {"nodes": [codec_status.node_status_to(n) for n in nodes], "next_page_token": next_token}

    return {
        "allocate": allocate,
        "commit": commit,
        "release": release,
        "get": get,
        "list": listing,
        "cluster": cluster_status,
    }


async def serve_nats(nc: Client, service: AllocatorService) -> list[Responder]:
    return [
        await Responder(nc, f"{PREFIX}.{verb}", handler, queue=QUEUE).start()
        for verb, handler in handlers(service).items()
    ]
