"""The allocator's NATS payloads to and from domain calls (JSON; see docs/nats-api.md)."""

from __future__ import annotations

from typing import Any

from gpuledger_allocator.reserving import AllocateCall
from gpuledger_core import codec
from gpuledger_core.codec import Reader
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.model import Allocation, Isolation


def ask_from(r: Reader) -> ContainerAsk:
    return ContainerAsk(r.text("container", ""), codec.request_from(r.obj("request")), r.flag("init"))


def allocate_call_from(raw: object) -> AllocateCall:
    r = Reader(raw)
    node = r.text("node", "")
    return AllocateCall(
        owner=codec.owner_from(r.obj("owner")),
        asks=r.items("containers", ask_from),
        isolation=r.enum("isolation", Isolation, Isolation.NONE),
        lease_s=r.opt_number("lease_s"),
        commit=r.flag("commit"),
        node=NodeName(node) if node else None,
    )


def allocate_call_to(call: AllocateCall) -> dict[str, Any]:
    return {
        "owner": codec.owner_to(call.owner),
        "containers": [
            {"container": a.container, "request": codec.request_to(a.request), "init": a.init} for a in call.asks
        ],
        "isolation": call.isolation.value,
        "lease_s": call.lease_s,
        "commit": call.commit,
        "node": call.node or "",
    }


def allocation_id_from(raw: object) -> AllocationId:
    value = Reader(raw).text("allocation_id")
    if not value:
        raise InvalidArgument("allocation_id", "must not be empty")
    return AllocationId(value)


def allocated(allocation: Allocation, existing: bool) -> dict[str, Any]:
    return {"allocation": codec.allocation_to(allocation), "existing": existing}
