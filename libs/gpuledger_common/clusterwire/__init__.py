"""The listings in protobuf's wire format, written and read here rather than by betterproto.

These are the messages ``Cluster``, ``NodeStatus``, ``CardStatus``, ``Holder`` and ``Owner`` of
``proto/gpuledger/allocator/v1/allocator.proto``, made from and into the core's ``NodeStatus``
directly; ``Allocation``, ``AllocateResponse`` and ``ListAllocationsResponse`` (written only: the
allocator answers with them, and the CLI does not list allocations); and ``AllocateRequest`` (read
only: what the allocator is asked). betterproto took about 2 ms per node of 8 cards each way (1 KB
on the wire), so one listing of 5,000 nodes cost the allocator some 10 s of CPU, and the CLI as
much again to read it; about 0.45 ms per allocation, 18 s of the allocator's event loop for the
40,000 allocations of such a cluster; and 0.23 ms to read an AllocateRequest. Here a node takes
tens of microseconds, an allocation a few, and the allocator keeps each node's encoded cards while
they are unchanged (``encoded_cards``). The bytes are the proto's: betterproto's classes read what
this writes and the other way round, byte for byte (tests/unit/common/test_clusterwire.py).

Fields are written in the proto's order and fields at their default value are left out, as
proto3 and betterproto do. Reading skips fields it does not know (a newer server may send more)
and refuses, naming the field, a value of the wrong wire type or bytes that end too early.

The modules: ``wire`` (one field written, one message's fields read), ``cluster`` (the listing's
messages, both ways) and ``allocation`` (an allocation's messages written, the Allocate request
read). The names below are the package's public ones.
"""

from gpuledger_common.clusterwire.allocation import (
    ALLOCATE_REQUEST,
    CONTAINER_REQUEST,
    RESOURCE_REQUEST,
    AllocateAsked,
    allocate_request_from,
    allocate_response_bytes,
    allocation_bytes,
    allocations_bytes,
    grant_bytes,
    share_bytes,
)
from gpuledger_common.clusterwire.cluster import (
    CARD,
    CARDS_KEPT,
    CLUSTER,
    HOLDER,
    NODE,
    OWNER,
    card_bytes,
    card_from,
    cluster_bytes,
    cluster_from,
    encoded_cards,
    holder_bytes,
    holder_from,
    node_bytes,
    node_from,
    owner_bytes,
    owner_from,
)
from gpuledger_common.clusterwire.wire import FIXED32, FIXED64, LENGTH, MASK64, VARINT, Spec

__all__ = [
    "ALLOCATE_REQUEST",
    "CARD",
    "CARDS_KEPT",
    "CLUSTER",
    "CONTAINER_REQUEST",
    "FIXED32",
    "FIXED64",
    "HOLDER",
    "LENGTH",
    "MASK64",
    "NODE",
    "OWNER",
    "RESOURCE_REQUEST",
    "VARINT",
    "AllocateAsked",
    "Spec",
    "allocate_request_from",
    "allocate_response_bytes",
    "allocation_bytes",
    "allocations_bytes",
    "card_bytes",
    "card_from",
    "cluster_bytes",
    "cluster_from",
    "encoded_cards",
    "grant_bytes",
    "holder_bytes",
    "holder_from",
    "node_bytes",
    "node_from",
    "owner_bytes",
    "owner_from",
    "share_bytes",
]
