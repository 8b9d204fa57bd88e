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
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from gpuledger_common.pbconvert import enum_of
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.model import Allocation, AllocState, Card, CardShare, Grant, Health, Owner, OwnerKind, Request
from gpuledger_core.status import CardStatus, Holder, NodeStatus

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
MASK64 = (1 << 64) - 1
CARDS_KEPT = 50_000  # nodes whose encoded cards the allocator keeps (past that it starts afresh)
_DOUBLE = struct.Struct("<d")
_SMALL = [bytes([n]) for n in range(128)]


def _varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL[value]
    value &= MASK64  # a negative int32 or int64 goes as its 64-bit two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _text(out: list[bytes], field: int, value: str) -> None:
    if value:
        data = value.encode()
        out += (_key(field, LENGTH), _varint(len(data)), data)


def _number(out: list[bytes], field: int, value: int) -> None:
    if value:
        out += (_key(field, VARINT), _varint(value))


def _flag(out: list[bytes], field: int, value: bool) -> None:
    if value:
        out += (_key(field, VARINT), b"\x01")


def _double(out: list[bytes], field: int, value: float) -> None:
    if value:
        out += (_key(field, FIXED64), _DOUBLE.pack(value))


def _message(out: list[bytes], field: int, body: bytes) -> None:
    out += (_key(field, LENGTH), _varint(len(body)), body)


def owner_bytes(owner: Owner) -> bytes:
    out: list[bytes] = []
    _text(out, 1, owner.kind.value)
    _text(out, 2, owner.id)
    _text(out, 3, owner.namespace)
    _text(out, 4, owner.name)
    return b"".join(out)


def holder_bytes(h: Holder) -> bytes:
    out: list[bytes] = []
    _text(out, 1, h.allocation_id)
    _message(out, 2, owner_bytes(h.owner))
    _text(out, 3, h.container)
    _number(out, 4, h.mem_mib)
    _number(out, 5, h.core_milli)
    _flag(out, 6, h.exclusive)
    _text(out, 7, h.state.value)
    _double(out, 8, h.since)
    return b"".join(out)


def card_bytes(c: CardStatus) -> bytes:
    out: list[bytes] = []
    card = c.card
    _text(out, 1, card.uuid)
    _number(out, 2, card.index)
    _text(out, 3, card.model)
    _number(out, 4, card.memory_mib)
    _number(out, 5, c.free_mem_mib)
    _number(out, 6, c.free_core_milli)
    _text(out, 7, card.health.value)
    _number(out, 8, -1 if card.numa is None else card.numa)
    for holder in c.holders:
        _message(out, 9, holder_bytes(holder))
    _number(out, 10, c.processes)
    _number(out, 11, c.foreign_processes)
    _number(out, 12, c.foreign_mib)
    _text(out, 13, card.health_reason)
    return b"".join(out)


def _cards_bytes(cards: tuple[CardStatus, ...]) -> bytes:
    out: list[bytes] = []
    for card in cards:
        _message(out, 2, card_bytes(card))
    return b"".join(out)


_CARDS: dict[str, tuple[tuple[CardStatus, ...], bytes]] = {}  # node -> its cards, and their bytes


def encoded_cards(node: str, cards: tuple[CardStatus, ...]) -> bytes:
    """A node's cards as ``NodeStatus`` field 2. The last ones written for each node are kept
    while they are this very tuple (the view makes a node's statuses again only when its key or
    its usage changed); one entry per node, so what is kept is bounded by the fleet."""
    known = _CARDS.get(node)
    if known is not None and known[0] is cards:
        return known[1]
    data = _cards_bytes(cards)
    if len(_CARDS) >= CARDS_KEPT:
        _CARDS.clear()
    _CARDS[node] = (cards, data)
    return data


def node_bytes(s: NodeStatus) -> bytes:
    out: list[bytes] = []
    _text(out, 1, s.name)
    out.append(encoded_cards(s.name, s.cards))
    _flag(out, 3, s.stale)
    _number(out, 4, s.revision)
    _text(out, 5, s.unreadable)
    return b"".join(out)


def cluster_bytes(nodes: Sequence[NodeStatus], next_page_token: str = "") -> bytes:
    """A ``Cluster`` message: the nodes, and the token of the next page ("" on the last)."""
    out: list[bytes] = []
    for node in nodes:
        _message(out, 1, node_bytes(node))
    _text(out, 2, next_page_token)
    return b"".join(out)


def share_bytes(s: CardShare) -> bytes:
    out: list[bytes] = []
    _text(out, 1, s.uuid)
    _number(out, 2, s.index)
    _number(out, 3, s.mem_mib)
    _number(out, 4, s.core_milli)
    _flag(out, 5, s.exclusive)
    return b"".join(out)


def grant_bytes(g: Grant) -> bytes:
    out: list[bytes] = []
    _text(out, 1, g.container)
    for share in g.cards:
        _message(out, 2, share_bytes(share))
    _flag(out, 3, g.init)
    return b"".join(out)


def allocation_bytes(a: Allocation) -> bytes:
    """An ``Allocation`` message (``pbconvert.allocation_to``'s fields: not the requests, nor the
    grants' device IDs)."""
    out: list[bytes] = []
    _text(out, 1, a.id)
    _message(out, 2, owner_bytes(a.owner))
    _text(out, 3, a.node)
    for grant in a.grants:
        _message(out, 4, grant_bytes(grant))
    _text(out, 5, a.state.value)
    _text(out, 6, a.isolation.value)
    _double(out, 7, a.created_at)
    _double(out, 8, a.updated_at)
    _double(out, 9, a.lease_expires_at or 0.0)
    _text(out, 10, a.reason)
    return b"".join(out)


def allocate_response_bytes(allocation: Allocation, existing: bool) -> bytes:
    """An ``AllocateResponse``."""
    out: list[bytes] = []
    _message(out, 1, allocation_bytes(allocation))
    _flag(out, 2, existing)
    return b"".join(out)


def allocations_bytes(allocations: Sequence[Allocation], next_page_token: str = "") -> bytes:
    """A ``ListAllocationsResponse`` (or a run of its allocations: runs joined make one message,
    the one with the token last)."""
    out: list[bytes] = []
    for allocation in allocations:
        _message(out, 1, allocation_bytes(allocation))
    _text(out, 2, next_page_token)
    return b"".join(out)


# --- reading ---


class _Reader:
    """The fields of one message, in order: (field number, wire type, value). A varint is an int,
    a fixed64 its 8 bytes, a length-delimited field its bytes."""

    __slots__ = ("data", "end", "path", "pos")

    def __init__(self, data: bytes, path: str, start: int = 0, end: int | None = None) -> None:
        self.data, self.pos, self.end, self.path = data, start, len(data) if end is None else end, path

    def varint(self) -> int:
        data, pos, result, shift = self.data, self.pos, 0, 0
        while True:
            if pos >= self.end:
                raise InvalidArgument(self.path, "ends inside a number (truncated?)")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return result
            shift += 7
            if shift > 63:
                raise InvalidArgument(self.path, "holds a number longer than 10 bytes")

    def take(self, size: int) -> int:
        """Skip ``size`` bytes; where they began."""
        start = self.pos
        if size < 0 or start + size > self.end:
            raise InvalidArgument(self.path, "ends inside a field (truncated?)")
        self.pos = start + size
        return start

    def fields(self) -> list[tuple[int, int, object]]:
        found: list[tuple[int, int, object]] = []
        while self.pos < self.end:
            key = self.varint()
            field, wire = key >> 3, key & 7
            value: object
            if wire == VARINT:
                value = self.varint()
            elif wire == LENGTH:
                size = self.varint()
                start = self.take(size)
                value = self.data[start : start + size]
            elif wire == FIXED64:
                start = self.take(8)
                value = self.data[start : start + 8]
            elif wire == FIXED32:
                start = self.take(4)
                value = self.data[start : start + 4]
            else:
                raise InvalidArgument(self.path, f"field {field} has wire type {wire}, which proto3 does not use")
            found.append((field, wire, value))
        return found


Spec = dict[int, tuple[str, int]]  # field number -> (name, wire type)


def _values(data: bytes, path: str, spec: Spec) -> dict[str, object]:
    """The known fields of the message in ``data`` by name (a repeated field: every value in a
    list); a known field of the wrong wire type is refused by name, unknown fields are skipped."""
    values: dict[str, object] = {}
    for field, wire, value in _Reader(data, path).fields():
        known = spec.get(field)
        if known is None:
            continue
        name, expected = known
        if wire != expected:
            raise InvalidArgument(f"{path}.{name}", f"has wire type {wire}, expected {expected}")
        if name.endswith("[]"):
            items = values.setdefault(name, [])
            assert isinstance(items, list)
            items.append(value)
        else:
            values[name] = value
    return values


def _string(values: dict[str, object], name: str, path: str) -> str:
    raw = values.get(name, b"")
    assert isinstance(raw, bytes)
    return _text_of(raw, f"{path}.{name}")


def _text_of(raw: bytes, path: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as err:
        raise InvalidArgument(path, f"is not UTF-8: {err}") from None


def _uint(values: dict[str, object], name: str) -> int:
    raw = values.get(name, 0)
    assert isinstance(raw, int)
    return raw


def _uint32(values: dict[str, object], name: str) -> int:
    return _uint(values, name) & 0xFFFFFFFF  # protobuf keeps a 32-bit field's low 32 bits


def _int32(values: dict[str, object], name: str) -> int:
    raw = _uint32(values, name)
    return raw - (1 << 32) if raw >= 1 << 31 else raw


def _items(values: dict[str, object], name: str) -> list[bytes]:
    found = values.get(name, [])
    assert isinstance(found, list)
    return found


OWNER: Spec = {1: ("kind", LENGTH), 2: ("id", LENGTH), 3: ("namespace", LENGTH), 4: ("name", LENGTH)}
HOLDER: Spec = {
    1: ("allocation_id", LENGTH),
    2: ("owner", LENGTH),
    3: ("container", LENGTH),
    4: ("mem_mib", VARINT),
    5: ("core_permille", VARINT),
    6: ("exclusive", VARINT),
    7: ("state", LENGTH),
    8: ("since", FIXED64),
}
CARD: Spec = {
    1: ("uuid", LENGTH),
    2: ("index", VARINT),
    3: ("model", LENGTH),
    4: ("memory_mib", VARINT),
    5: ("free_mem_mib", VARINT),
    6: ("free_core_permille", VARINT),
    7: ("health", LENGTH),
    8: ("numa", VARINT),
    9: ("holders[]", LENGTH),
    10: ("processes", VARINT),
    11: ("foreign_processes", VARINT),
    12: ("foreign_mem_mib", VARINT),
    13: ("health_reason", LENGTH),
}
NODE: Spec = {
    1: ("name", LENGTH),
    2: ("cards[]", LENGTH),
    3: ("stale", VARINT),
    4: ("revision", VARINT),
    5: ("unreadable", LENGTH),
}
CLUSTER: Spec = {1: ("nodes[]", LENGTH), 2: ("next_page_token", LENGTH)}


def owner_from(data: bytes, path: str) -> Owner:
    v = _values(data, path, OWNER)
    kind = enum_of(OwnerKind, _string(v, "kind", path), f"{path}.kind")
    return Owner(kind, _string(v, "id", path), _string(v, "namespace", path), _string(v, "name", path))


def holder_from(data: bytes, path: str) -> Holder:
    v = _values(data, path, HOLDER)
    state = enum_of(AllocState, _string(v, "state", path), f"{path}.state")
    since = v.get("since")
    return Holder(
        AllocationId(_string(v, "allocation_id", path)),
        owner_from(v.get("owner", b""), f"{path}.owner"),  # type: ignore[arg-type]
        _string(v, "container", path),
        _uint(v, "mem_mib"),
        _uint(v, "core_permille"),
        bool(_uint(v, "exclusive")),
        state,
        _DOUBLE.unpack(since)[0] if isinstance(since, bytes) else 0.0,
    )


def card_from(data: bytes, path: str) -> CardStatus:
    v = _values(data, path, CARD)
    numa = _int32(v, "numa")
    health = enum_of(Health, _string(v, "health", path), f"{path}.health", Health.HEALTHY)
    card = Card(
        CardUuid(_string(v, "uuid", path)),
        _uint(v, "index"),
        _string(v, "model", path),
        _uint(v, "memory_mib"),
        None if numa < 0 else numa,
        health,
        health_reason=_string(v, "health_reason", path),
    )
    holders = tuple(holder_from(h, f"{path}.holders[{i}]") for i, h in enumerate(_items(v, "holders[]")))
    return CardStatus(
        card,
        _uint(v, "free_mem_mib"),
        _uint(v, "free_core_permille"),
        holders,
        _uint(v, "processes"),
        _uint(v, "foreign_processes"),
        _uint(v, "foreign_mem_mib"),
    )


def node_from(data: bytes, path: str = "node") -> NodeStatus:
    v = _values(data, path, NODE)
    cards = tuple(card_from(c, f"{path}.cards[{i}]") for i, c in enumerate(_items(v, "cards[]")))
    name, unreadable = NodeName(_string(v, "name", path)), _string(v, "unreadable", path)
    return NodeStatus(name, cards, bool(_uint(v, "stale")), _uint(v, "revision"), unreadable)


def cluster_from(data: bytes) -> tuple[list[NodeStatus], str]:
    """A ``Cluster`` message's nodes and its next page's token."""
    v = _values(data, "cluster", CLUSTER)
    nodes = [node_from(n, f"cluster.nodes[{i}]") for i, n in enumerate(_items(v, "nodes[]"))]
    return nodes, _string(v, "next_page_token", "cluster")


# --- the Allocate request (read only: what the allocator is asked) ---

RESOURCE_REQUEST: Spec = {
    1: ("gpu", VARINT),
    2: ("gpu_mem_mib", VARINT),
    3: ("gpu_core_permille", VARINT),
    4: ("models[]", LENGTH),
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
    v = _values(data, "allocate request", ALLOCATE_REQUEST)
    raw_owner = v.get("owner")
    if not isinstance(raw_owner, bytes):
        raise InvalidArgument("owner", "is required")
    try:
        owner = owner_from(raw_owner, "owner")
    except InvalidArgument as err:  # the owner's own checks name its field alone
        raise InvalidArgument(f"owner.{err.field.removeprefix('owner.')}", err.problem) from err
    containers = _items(v, "containers[]")
    asks = tuple(_container_from(c, f"containers[{i}]") for i, c in enumerate(containers))
    return AllocateAsked(
        owner,
        asks,
        _string(v, "isolation", "allocate request"),
        _uint32(v, "lease_seconds"),
        bool(_uint(v, "commit")),
        _string(v, "node", "allocate request"),
    )


def _container_from(data: bytes, path: str) -> ContainerAsk:
    v = _values(data, path, CONTAINER_REQUEST)
    request = v.get("request", b"")  # absent: an empty request, refused for its 0 cards
    assert isinstance(request, bytes)
    return ContainerAsk(
        _string(v, "container", path), _request_from(request, f"{path}.request"), bool(_uint(v, "init"))
    )


def _request_from(data: bytes, path: str) -> Request:
    v = _values(data, path, RESOURCE_REQUEST)
    models = [_text_of(m, f"{path}.models[{i}]") for i, m in enumerate(_items(v, "models[]"))]
    try:
        return Request(
            count=_uint32(v, "gpu"),
            mem_mib=_uint(v, "gpu_mem_mib") & MASK64 if "gpu_mem_mib" in v else None,  # optional: absent is None
            core_milli=_uint32(v, "gpu_core_permille") if "gpu_core_permille" in v else None,
            models=frozenset(m for m in models if m),
        )
    except InvalidArgument as err:
        raise InvalidArgument(f"{path}.{err.field}", err.problem) from err
