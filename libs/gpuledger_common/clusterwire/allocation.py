"""An allocation's messages: ``Allocation``, ``AllocateResponse`` and ``ListAllocationsResponse``
written (the allocator answers with them; the CLI does not list allocations), and
``AllocateRequest`` read (what the allocator is asked; ``Owner`` as the listing has it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuledger_common.clusterwire.cluster import owner_bytes, owner_from, slot_bytes
from gpuledger_common.clusterwire.wire import (
    LENGTH,
    MASK64,
    VARINT,
    Spec,
    double,
    flag,
    items,
    message,
    number,
    string,
    text,
    text_of,
    uint,
    uint32,
    values_of,
)
from gpuledger_common.pbconvert import mig_of
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.model import Allocation, CardShare, Drain, Grant, Owner, Request

# --- writing ---


def share_bytes(s: CardShare) -> bytes:
    out: list[bytes] = []
    text(out, 1, s.uuid)
    number(out, 2, s.index)
    number(out, 3, s.mem_mib)
    number(out, 4, s.core_milli)
    flag(out, 5, s.exclusive)
    if s.mig is not None:  # set, even if empty: written (as betterproto writes a message whose fields were given)
        message(out, 6, slot_bytes(s.mig))
    return b"".join(out)


def grant_bytes(g: Grant) -> bytes:
    out: list[bytes] = []
    text(out, 1, g.container)
    for share in g.cards:
        message(out, 2, share_bytes(share))
    flag(out, 3, g.init)
    return b"".join(out)


def allocation_bytes(a: Allocation) -> bytes:
    """An ``Allocation`` message (``pbconvert.allocation_to``'s fields: not the requests, nor the
    grants' device IDs)."""
    out: list[bytes] = []
    text(out, 1, a.id)
    message(out, 2, owner_bytes(a.owner))
    text(out, 3, a.node)
    for grant in a.grants:
        message(out, 4, grant_bytes(grant))
    text(out, 5, a.state.value)
    text(out, 6, a.isolation.value)
    double(out, 7, a.created_at)
    double(out, 8, a.updated_at)
    double(out, 9, a.lease_expires_at or 0.0)
    text(out, 10, a.reason)
    if a.drain is not None:
        message(out, 11, drain_bytes(a.drain))
    return b"".join(out)


def drain_bytes(d: Drain) -> bytes:
    out: list[bytes] = []
    text(out, 1, d.card)
    number(out, 2, d.card_index)
    double(out, 3, d.since)
    double(out, 4, d.release_at)
    text(out, 5, d.reason)
    return b"".join(out)


def allocate_response_bytes(allocation: Allocation, existing: bool) -> bytes:
    """An ``AllocateResponse``."""
    out: list[bytes] = []
    message(out, 1, allocation_bytes(allocation))
    flag(out, 2, existing)
    return b"".join(out)


def allocations_bytes(allocations: Sequence[Allocation], next_page_token: str = "") -> bytes:
    """A ``ListAllocationsResponse`` (or a run of its allocations: runs joined make one message,
    the one with the token last)."""
    out: list[bytes] = []
    for allocation in allocations:
        message(out, 1, allocation_bytes(allocation))
    text(out, 2, next_page_token)
    return b"".join(out)


# --- the Allocate request (read only: what the allocator is asked) ---

RESOURCE_REQUEST: Spec = {
    1: ("gpu", VARINT),
    2: ("gpu_mem_mib", VARINT),
    3: ("gpu_core_permille", VARINT),
    4: ("models[]", LENGTH),
    5: ("mig", LENGTH),
}
CONTAINER_REQUEST: Spec = {1: ("container", LENGTH), 2: ("request", LENGTH), 3: ("init", VARINT)}
ALLOCATE_REQUEST: Spec = {
    1: ("owner", LENGTH),
    2: ("containers[]", LENGTH),
    3: ("isolation", LENGTH),
    4: ("lease_seconds", VARINT),
    5: ("commit", VARINT),
    6: ("node", LENGTH),
}


@dataclass(frozen=True, slots=True)
class AllocateAsked:
    """An ``AllocateRequest``'s fields as the allocator takes them."""

    owner: Owner
    asks: tuple[ContainerAsk, ...]
    isolation: str
    lease_seconds: int
    commit: bool
    node: str


def allocate_request_from(data: bytes) -> AllocateAsked:
    """An ``AllocateRequest``, refused as ``pbconvert`` refuses the message betterproto reads from
    the same bytes: a missing owner, and each bad value, by its field."""
    v = values_of(data, "allocate request", ALLOCATE_REQUEST)
    raw_owner = v.get("owner")
    if not isinstance(raw_owner, bytes):
        raise InvalidArgument("owner", "is required")
    try:
        owner = owner_from(raw_owner, "owner")
    except InvalidArgument as err:  # the owner's own checks name its field alone
        raise InvalidArgument(f"owner.{err.field.removeprefix('owner.')}", err.problem) from err
    containers = items(v, "containers[]")
    asks = tuple(_container_from(c, f"containers[{i}]") for i, c in enumerate(containers))
    return AllocateAsked(
        owner,
        asks,
        string(v, "isolation", "allocate request"),
        uint32(v, "lease_seconds"),
        bool(uint(v, "commit")),
        string(v, "node", "allocate request"),
    )


def _container_from(data: bytes, path: str) -> ContainerAsk:
    v = values_of(data, path, CONTAINER_REQUEST)
    request = v.get("request", b"")  # absent: an empty request, refused for its 0 cards
    assert isinstance(request, bytes)
    return ContainerAsk(string(v, "container", path), _request_from(request, f"{path}.request"), bool(uint(v, "init")))


def _request_from(data: bytes, path: str) -> Request:
    v = values_of(data, path, RESOURCE_REQUEST)
    models = [text_of(m, f"{path}.models[{i}]") for i, m in enumerate(items(v, "models[]"))]
    mig = string(v, "mig", path)
    try:
        return Request(
            count=uint32(v, "gpu"),
            mem_mib=uint(v, "gpu_mem_mib") & MASK64 if "gpu_mem_mib" in v else None,  # optional: absent is None
            core_milli=uint32(v, "gpu_core_permille") if "gpu_core_permille" in v else None,
            models=frozenset(m for m in models if m),
            mig=mig_of(mig),
        )
    except InvalidArgument as err:
        raise InvalidArgument(f"{path}.{err.field}", err.problem) from err
