"""The cluster listing's messages, written and read: ``Cluster``, ``NodeStatus``, ``CardStatus``,
``Holder``, ``Owner``, ``MigSlot`` and ``MigInstanceStatus``, made from and into the core's
``NodeStatus`` directly.

The allocator writes a listing (GetCluster) and keeps each node's encoded cards while they are
unchanged (``encoded_cards``); the CLI reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger_common.clusterwire.wire import (
    DOUBLE,
    FIXED64,
    LENGTH,
    VARINT,
    Spec,
    double,
    flag,
    int32,
    items,
    message,
    number,
    string,
    text,
    uint,
    uint32,
    values_of,
)
from gpuledger_common.pbconvert import enum_of
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.model import (
    AllocState,
    Card,
    CardMode,
    Health,
    MigInstance,
    MigSlot,
    Owner,
    OwnerKind,
    Remedy,
)
from gpuledger_core.status import CardStatus, Holder, NodeStatus

CARDS_KEPT = 50_000  # nodes whose encoded cards the allocator keeps (past that it starts afresh)
_WHOLE = b"\x7a\x05whole"  # CardStatus.mode (15) of a card not in MIG mode, written once

# --- writing ---


def owner_bytes(owner: Owner) -> bytes:
    out: list[bytes] = []
    text(out, 1, owner.kind.value)
    text(out, 2, owner.id)
    text(out, 3, owner.namespace)
    text(out, 4, owner.name)
    return b"".join(out)


def slot_bytes(slot: MigSlot) -> bytes:
    """A ``MigSlot``'s body; a field holding one is written whenever set, even empty, as
    betterproto writes a message whose fields were given."""
    out: list[bytes] = []
    text(out, 1, slot.profile)
    number(out, 2, slot.start)
    number(out, 3, slot.size)
    return b"".join(out)


def instance_bytes(c: CardStatus, i: MigInstance) -> bytes:
    """A ``MigInstanceStatus``: the instance, and the allocation holding it where one of the
    card's holders does (``pbconvert.instance_to``)."""
    out: list[bytes] = []
    slot, holder = i.slot, c.holder_of(i)
    text(out, 1, slot.profile)
    number(out, 2, slot.start)
    number(out, 3, slot.size)
    flag(out, 4, i.static)
    text(out, 5, i.uuid)
    text(out, 6, holder.allocation_id if holder is not None else "")
    text(out, 7, i.fault)
    text(out, 8, i.remedy.value)
    return b"".join(out)


def holder_bytes(h: Holder) -> bytes:
    out: list[bytes] = []
    text(out, 1, h.allocation_id)
    message(out, 2, owner_bytes(h.owner))
    text(out, 3, h.container)
    number(out, 4, h.mem_mib)
    number(out, 5, h.core_milli)
    flag(out, 6, h.exclusive)
    text(out, 7, h.state.value)
    double(out, 8, h.since)
    flag(out, 9, h.used_mib is not None)
    number(out, 10, h.used_mib or 0)
    flag(out, 11, h.over)
    flag(out, 12, h.used_core_milli is not None)
    number(out, 13, h.used_core_milli or 0)
    if h.mig is not None:
        message(out, 14, slot_bytes(h.mig))
    return b"".join(out)


def card_bytes(c: CardStatus) -> bytes:
    out: list[bytes] = []
    card = c.card
    text(out, 1, card.uuid)
    number(out, 2, card.index)
    text(out, 3, card.model)
    number(out, 4, card.memory_mib)
    number(out, 5, c.free_mem_mib)
    number(out, 6, c.free_core_milli)
    text(out, 7, card.health.value)
    number(out, 8, -1 if card.numa is None else card.numa)
    for holder in c.holders:
        message(out, 9, holder_bytes(holder))
    number(out, 10, c.processes)
    number(out, 11, c.foreign_processes)
    number(out, 12, c.foreign_mib)
    text(out, 13, card.health_reason)
    text(out, 14, card.remedy.value)
    if card.mode is CardMode.WHOLE and not card.instances:
        out.append(_WHOLE)
    else:
        text(out, 15, card.mode.value)
        for instance in card.instances:
            message(out, 16, instance_bytes(c, instance))
    return b"".join(out)


def cards_bytes(cards: tuple[CardStatus, ...]) -> bytes:
    """A node's cards as ``NodeStatus`` field 2, written afresh."""
    out: list[bytes] = []
    for card in cards:
        message(out, 2, card_bytes(card))
    return b"".join(out)


_CARDS: dict[str, tuple[tuple[CardStatus, ...], bytes]] = {}  # node -> its cards, and their bytes


def encoded_cards(node: str, cards: tuple[CardStatus, ...]) -> bytes:
    """A node's cards as ``NodeStatus`` field 2. The last ones written for each node are kept
    while they are this very tuple (the view makes a node's statuses again only when its key or
    its usage changed); one entry per node, so what is kept is bounded by the fleet."""
    known = _CARDS.get(node)
    if known is not None and known[0] is cards:
        return known[1]
    data = cards_bytes(cards)
    if len(_CARDS) >= CARDS_KEPT:
        _CARDS.clear()
    _CARDS[node] = (cards, data)
    return data


def node_bytes(s: NodeStatus) -> bytes:
    out: list[bytes] = []
    text(out, 1, s.name)
    out.append(encoded_cards(s.name, s.cards))
    flag(out, 3, s.stale)
    number(out, 4, s.revision)
    text(out, 5, s.unreadable)
    return b"".join(out)


def cluster_bytes(nodes: Sequence[NodeStatus], next_page_token: str = "") -> bytes:
    """A ``Cluster`` message: the nodes, and the token of the next page ("" on the last)."""
    out: list[bytes] = []
    for node in nodes:
        message(out, 1, node_bytes(node))
    text(out, 2, next_page_token)
    return b"".join(out)


# --- reading ---

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
    9: ("measured", VARINT),
    10: ("used_mib", VARINT),
    11: ("over_grant", VARINT),
    12: ("core_measured", VARINT),
    13: ("used_core_permille", VARINT),
    14: ("mig", LENGTH),
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
    14: ("remedy", LENGTH),
    15: ("mode", LENGTH),
    16: ("instances[]", LENGTH),
}
MIG_SLOT: Spec = {1: ("profile", LENGTH), 2: ("start", VARINT), 3: ("size", VARINT)}
MIG_INSTANCE: Spec = {
    **MIG_SLOT,
    4: ("static", VARINT),
    5: ("uuid", LENGTH),
    6: ("allocation_id", LENGTH),
    7: ("fault", LENGTH),
    8: ("remedy", LENGTH),
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
    v = values_of(data, path, OWNER)
    kind = enum_of(OwnerKind, string(v, "kind", path), f"{path}.kind")
    return Owner(kind, string(v, "id", path), string(v, "namespace", path), string(v, "name", path))


def slot_from(data: bytes, path: str) -> MigSlot | None:
    """A ``MigSlot``; None for an empty one (a placement always names its profile)."""
    v = values_of(data, path, MIG_SLOT)
    profile = string(v, "profile", path)
    return MigSlot(profile, uint32(v, "start"), uint32(v, "size")) if profile else None


def instance_from(data: bytes, path: str) -> MigInstance:
    """A ``MigInstanceStatus`` as the ledger holds the instance (who holds it is the card's
    holders' to say)."""
    v = values_of(data, path, MIG_INSTANCE)
    slot = MigSlot(string(v, "profile", path), uint32(v, "start"), uint32(v, "size"))
    remedy = enum_of(Remedy, string(v, "remedy", path), f"{path}.remedy", Remedy.NONE)
    return MigInstance(slot, bool(uint(v, "static")), string(v, "uuid", path), string(v, "fault", path), remedy)


def holder_from(data: bytes, path: str) -> Holder:
    v = values_of(data, path, HOLDER)
    state = enum_of(AllocState, string(v, "state", path), f"{path}.state")
    since, mig = v.get("since"), v.get("mig")
    return Holder(
        AllocationId(string(v, "allocation_id", path)),
        owner_from(v.get("owner", b""), f"{path}.owner"),  # type: ignore[arg-type]
        string(v, "container", path),
        uint(v, "mem_mib"),
        uint(v, "core_permille"),
        bool(uint(v, "exclusive")),
        state,
        DOUBLE.unpack(since)[0] if isinstance(since, bytes) else 0.0,
        uint(v, "used_mib") if uint(v, "measured") else None,
        bool(uint(v, "over_grant")),
        uint(v, "used_core_permille") if uint(v, "core_measured") else None,
        slot_from(mig, f"{path}.mig") if isinstance(mig, bytes) else None,
    )


def card_from(data: bytes, path: str) -> CardStatus:
    v = values_of(data, path, CARD)
    numa = int32(v, "numa")
    health = enum_of(Health, string(v, "health", path), f"{path}.health", Health.HEALTHY)
    mode, instances = _mig_of(v, path)
    card = Card(
        CardUuid(string(v, "uuid", path)),
        uint(v, "index"),
        string(v, "model", path),
        uint(v, "memory_mib"),
        None if numa < 0 else numa,
        health,
        health_reason=string(v, "health_reason", path),
        remedy=enum_of(Remedy, string(v, "remedy", path), f"{path}.remedy", Remedy.NONE),
        mode=mode,
        instances=instances,
    )
    holders = tuple(holder_from(h, f"{path}.holders[{i}]") for i, h in enumerate(items(v, "holders[]")))
    return CardStatus(
        card,
        uint(v, "free_mem_mib"),
        uint(v, "free_core_permille"),
        holders,
        uint(v, "processes"),
        uint(v, "foreign_processes"),
        uint(v, "foreign_mem_mib"),
    )


def _mig_of(v: dict[str, object], path: str) -> tuple[CardMode, tuple[MigInstance, ...]]:
    """A card's mode and instances; a card in whole mode with none (most cards) at no cost."""
    mode = v.get("mode")
    if (mode is None or mode == b"whole") and "instances[]" not in v:
        return CardMode.WHOLE, ()
    found = items(v, "instances[]")
    return (
        enum_of(CardMode, string(v, "mode", path), f"{path}.mode", CardMode.WHOLE),
        tuple(instance_from(m, f"{path}.instances[{i}]") for i, m in enumerate(found)),
    )


def node_from(data: bytes, path: str = "node") -> NodeStatus:
    v = values_of(data, path, NODE)
    cards = tuple(card_from(c, f"{path}.cards[{i}]") for i, c in enumerate(items(v, "cards[]")))
    name, unreadable = NodeName(string(v, "name", path)), string(v, "unreadable", path)
    return NodeStatus(name, cards, bool(uint(v, "stale")), uint(v, "revision"), unreadable)


def cluster_from(data: bytes) -> tuple[list[NodeStatus], str]:
    """A ``Cluster`` message's nodes and its next page's token."""
    v = values_of(data, "cluster", CLUSTER)
    nodes = [node_from(n, f"cluster.nodes[{i}]") for i, n in enumerate(items(v, "nodes[]"))]
    return nodes, string(v, "next_page_token", "cluster")
