"""Domain values to and from plain JSON-ready dicts (the ledger's stored form and NATS payloads).

Decoding is strict: a missing or mistyped field raises ``InvalidArgument`` naming the field path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeVar

import orjson

from gpuledger_core.codec_mig import card_mig_from, card_mig_to, slot_from, slot_to
from gpuledger_core.errors import FailedPrecondition, InvalidArgument
from gpuledger_core.events import EventKind, LedgerEvent
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import (
    Allocation,
    AllocState,
    Card,
    CardMode,
    CardShare,
    Drain,
    Grant,
    Health,
    Isolation,
    Link,
    MigInstance,
    Node,
    Owner,
    OwnerKind,
    PcieLevel,
    Remedy,
    Request,
)

Json = dict[str, Any]

# The schema of ledger values and NATS bodies. A change within a schema only adds fields, which
# every reader of that schema ignores; anything else is a new schema. A value without "schema"
# was written before it was recorded, and is schema 1. A writer never replaces a value of a
# newer schema than its own (it would drop the fields it does not know): see ``check_writable``.
SCHEMA = 1
# A node's value that holds a card in MIG mode is written in schema 2: a reader that knows only
# schema 1 would take the card for a whole one (and its instances' holders for shares) and drop its
# instances when writing it back, so it must read it and never write it. Every other value and body
# is still written in schema 1, byte for byte as before. ``KNOWN`` is the newest schema this code
# reads and writes.
MIG_SCHEMA = 2
KNOWN = MIG_SCHEMA


def node_schema(node: Node) -> int:
    """The schema a ledger value of ``node`` is written in."""
    return MIG_SCHEMA if any(c.mode is CardMode.MIG for c in node.cards) else SCHEMA


def schema_of(raw: object) -> int:
    """The schema a ledger value or a body was written in."""
    if not isinstance(raw, Mapping) or "schema" not in raw:
        return 1
    value = raw["schema"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument("schema", f"must be a positive whole number, got {value!r}")
    return value


def check_writable(schema: int, what: str) -> None:
    """Refuse to replace ``what``, written in ``schema``, when this code knows an older one."""
    if schema > KNOWN:
        raise FailedPrecondition(
            f"{what} was written in schema {schema} by a newer gpuledger; this one knows schema {KNOWN} "
            "and would drop what it does not know: finish the upgrade (or roll it back) before this "
            "replica writes it"
        )


T = TypeVar("T")
E = TypeVar("E", bound=Enum)


class Reader:
    """Typed access to a JSON object that names the path of whatever is wrong."""

    __slots__ = ("_at", "raw")

    def __init__(self, raw: object, path: str | tuple[str, int] = "") -> None:
        # ``path`` may be (list path, index): spelled out only when an error names it, since a
        # value of thousands of nodes decodes tens of thousands of list items.
        self._at = path
        if not isinstance(raw, Mapping):
            raise InvalidArgument(self.path or "body", f"must be an object, got {type(raw).__name__}")
        self.raw = raw

    @property
    def path(self) -> str:
        at = self._at
        return at if isinstance(at, str) else f"{at[0]}[{at[1]}]"

    def _name(self, key: str) -> str:
        path = self.path
        return f"{path}.{key}" if path else key

    def _get(self, key: str, kind: type[T] | tuple[type, ...], default: Any) -> Any:
        value = self.raw.get(key)
        if value is None:
            if default is _REQUIRED:
                raise InvalidArgument(self._name(key), "is required")
            return default
        if type(value) is kind:  # the common case, decided at once (a bool's type is not int)
            return value
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            raise InvalidArgument(self._name(key), f"must be a number, got {value!r}")
        if not isinstance(value, kind):
            raise InvalidArgument(self._name(key), f"has the wrong type {type(value).__name__}")
        return value

    # text, integer and opt_int answer a value of the exact type at once (most fields, most of
    # the time), and leave the rest to ``_get``.

    def text(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key)
        if type(value) is str:
            return value
        return self._get(key, str, _REQUIRED if default is None else default)

    def integer(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key)
        if type(value) is int:
            return value
        return self._get(key, int, _REQUIRED if default is None else default)

    def opt_int(self, key: str) -> int | None:
        value = self.raw.get(key)
        if value is None or type(value) is int:
            return value
        checked: int | None = self._get(key, int, None)
        return checked

    def number(self, key: str, default: Any = None) -> Any:
        value = self._get(key, (int, float), _REQUIRED if default is None else default)
        return None if value is None else float(value)

    def opt_number(self, key: str) -> float | None:
        value = self._get(key, (int, float), None)
        return None if value is None else float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value: bool = self._get(key, bool, default)
        return value

    def enum(self, key: str, kind: type[E], default: E | None = None) -> E:
        raw = self._get(key, (str, int), _REQUIRED if default is None else default)
        if isinstance(raw, kind):
            return raw
        member = kind._value2member_map_.get(raw)
        if member is not None:
            return member  # type: ignore[return-value]
        try:
            return kind(raw)
        except ValueError:
            choices = "|".join(str(m.value) for m in kind)
            raise InvalidArgument(self._name(key), f"must be one of {choices}, got {raw!r}") from None

    def mapping(self, key: str) -> Mapping[str, object]:
        value: Mapping[str, object] = self._get(key, Mapping, {})
        return value

    def obj(self, key: str) -> Reader:
        return Reader(self._get(key, Mapping, _REQUIRED), self._name(key))

    def items(self, key: str, decode: Callable[[Reader], T]) -> tuple[T, ...]:
        values = self._get(key, list, [])
        at = self._name(key)
        return tuple(decode(Reader(v, (at, i))) for i, v in enumerate(values))

    def strings(self, key: str) -> tuple[str, ...]:
        values = self._get(key, list, [])
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise InvalidArgument(f"{self._name(key)}[{i}]", "must be a string")
        return tuple(values)

    def wrap(self, build: Callable[[], T]) -> T:
        """Run a constructor whose own validation names a bare field; prefix our path.

        Read the fields first (their errors carry the full path already), then ``wrap`` only
        the constructor."""
        try:
            return build()
        except InvalidArgument as err:
            if self.path:
                raise InvalidArgument(f"{self.path}.{err.field}", err.problem) from err
            raise


_REQUIRED: Any = object()
_WHOLE: tuple[CardMode, tuple[MigInstance, ...]] = (CardMode.WHOLE, ())  # a card without MIG fields


def card_to(card: Card) -> Json:
    out = {
        "uuid": card.uuid,
        "index": card.index,
        "model": card.model,
        "memory_mib": card.memory_mib,
        "numa": card.numa,
        "health": card.health.value,
        "minor": card.minor,
        "pci_bus_id": card.pci_bus_id,
        "health_reason": card.health_reason,
    }
    if card.remedy is not Remedy.NONE:  # written only when set: a serving card's value is as before
        out["remedy"] = card.remedy.value
    if card.mode is not CardMode.WHOLE or card.instances:  # likewise: a card not in MIG mode is as before
        card_mig_to(card, out)
    return out


def card_from(r: Reader) -> Card:
    raw = r.raw
    mode, instances = card_mig_from(r) if "mode" in raw or "instances" in raw else _WHOLE
    return Card(
        uuid=CardUuid(r.text("uuid")),
        index=r.integer("index"),
        model=r.text("model"),
        memory_mib=r.integer("memory_mib"),
        numa=r.opt_int("numa"),
        health=r.enum("health", Health, Health.HEALTHY),
        minor=r.opt_int("minor"),
        pci_bus_id=r.text("pci_bus_id", ""),
        health_reason=r.text("health_reason", ""),
        remedy=r.enum("remedy", Remedy, Remedy.NONE),
        mode=mode,
        instances=instances,
    )


def link_to(link: Link) -> Json:
    return {"a": link.a, "b": link.b, "nvlinks": link.nvlinks, "pcie": int(link.pcie)}


def link_from(r: Reader) -> Link:
    return Link(r.integer("a"), r.integer("b"), r.integer("nvlinks", 0), r.enum("pcie", PcieLevel, PcieLevel.SYSTEM))


_LINKS: dict[bytes, tuple[Link, ...]] = {}  # the links' JSON -> the links decoded from it
_LINKS_KEPT = 1024


def _links_from(r: Reader) -> tuple[Link, ...]:
    """The node's links. Nodes of one kind list the same links: they are decoded once and the
    nodes share them (and so the topology made from them, ``placement.state.topology_of``). The
    key is the list as JSON, which tells ``1`` from ``1.0`` and ``true``, so a value is only taken
    from the cache when decoding it would give the same links."""
    raw = r.raw.get("links")
    key = None
    if isinstance(raw, list):
        with contextlib.suppress(orjson.JSONEncodeError):
            key = orjson.dumps(raw)
    known = _LINKS.get(key) if key is not None else None
    if known is not None:
        return known
    links = r.items("links", link_from)
    if key is not None:
        if len(_LINKS) >= _LINKS_KEPT:
            _LINKS.clear()
        _LINKS[key] = links
    return links


def node_to(node: Node) -> Json:
    return {
        "name": node.name,
        "cards": [card_to(c) for c in node.cards],
        "links": [link_to(ln) for ln in node.links],
        "cpu_milli": node.cpu_milli,
        "memory_mib": node.memory_mib,
        "labels": dict(node.labels),
    }


def node_from(r: Reader) -> Node:
    labels = r.mapping("labels")
    return Node(
        name=NodeName(r.text("name")),
        cards=r.items("cards", card_from),
        links=_links_from(r),
        cpu_milli=r.integer("cpu_milli", 0),
        memory_mib=r.integer("memory_mib", 0),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
    )


def request_to(request: Request) -> Json:
    out: Json = {
        "count": request.count,
        "mem_mib": request.mem_mib,
        "core_milli": request.core_milli,
        "models": sorted(request.models),
    }
    if request.mig:  # written only when set
        out["mig"] = request.mig
    return out


def request_from(r: Reader) -> Request:
    count, mem, core = r.integer("count", 1), r.opt_int("mem_mib"), r.opt_int("core_milli")
    models, mig = frozenset(r.strings("models")), r.text("mig", "")
    return r.wrap(lambda: Request(count=count, mem_mib=mem, core_milli=core, models=models, mig=mig))


def owner_to(owner: Owner) -> Json:
    return {"kind": owner.kind.value, "id": owner.id, "namespace": owner.namespace, "name": owner.name}


def owner_from(r: Reader) -> Owner:
    kind, owner_id = r.enum("kind", OwnerKind), r.text("id")
    namespace, name = r.text("namespace", ""), r.text("name", "")
    return r.wrap(lambda: Owner(kind, owner_id, namespace, name))


def share_to(share: CardShare) -> Json:
    out: Json = {
        "uuid": share.uuid,
        "index": share.index,
        "mem_mib": share.mem_mib,
        "core_milli": share.core_milli,
        "exclusive": share.exclusive,
    }
    if share.mig is not None:  # written only when set: a share of a card is as before
        out["mig"] = slot_to(share.mig)
    return out


def share_from(r: Reader) -> CardShare:
    mig = slot_from(r.obj("mig")) if r.raw.get("mig") is not None else None
    return CardShare(
        CardUuid(r.text("uuid")),
        r.integer("index"),
        r.integer("mem_mib"),
        r.integer("core_milli"),
        r.flag("exclusive"),
        mig,
    )


def grant_to(grant: Grant) -> Json:
    cards = [share_to(s) for s in grant.cards]
    raw: Json = {"container": grant.container, "cards": cards, "init": grant.init}
    if grant.device_ids:  # only pods on a node with the plugin have them
        raw["device_ids"] = list(grant.device_ids)
    return raw


def grant_from(r: Reader) -> Grant:
    return Grant(r.text("container", ""), r.items("cards", share_from), r.flag("init"), r.strings("device_ids"))


def allocation_to(a: Allocation) -> Json:
    out: Json = {
        "id": a.id,
        "owner": owner_to(a.owner),
        "node": a.node,
        "grants": [grant_to(g) for g in a.grants],
        "state": a.state.value,
        "isolation": a.isolation.value,
        "created_at": a.created_at,
        "updated_at": a.updated_at,
        "lease_expires_at": a.lease_expires_at,
        "requests": [request_to(q) for q in a.requests],
        "reason": a.reason,
    }
    if a.drain is not None:  # written only when set: other allocations' values are as before
        out["drain"] = drain_to(a.drain)
    return out


def drain_to(d: Drain) -> Json:
    return {
        "card": d.card,
        "card_index": d.card_index,
        "since": d.since,
        "release_at": d.release_at,
        "reason": d.reason,
    }


def drain_from(r: Reader) -> Drain:
    return Drain(
        CardUuid(r.text("card")),
        r.integer("card_index"),
        r.number("since"),
        r.number("release_at"),
        r.text("reason", ""),
    )


def allocation_from(r: Reader) -> Allocation:
    return Allocation(
        id=AllocationId(r.text("id")),
        owner=owner_from(r.obj("owner")),
        node=NodeName(r.text("node")),
        grants=r.items("grants", grant_from),
        state=r.enum("state", AllocState),
        isolation=r.enum("isolation", Isolation, Isolation.NONE),
        created_at=r.number("created_at", 0.0),
        updated_at=r.number("updated_at", 0.0),
        lease_expires_at=r.opt_number("lease_expires_at"),
        requests=r.items("requests", request_from),
        reason=r.text("reason", ""),
        drain=drain_from(r.obj("drain")) if r.raw.get("drain") is not None else None,
    )


def ledger_to(ledger: NodeLedger) -> Json:
    return {
        "schema": node_schema(ledger.node),
        "node": node_to(ledger.node),
        "allocations": [allocation_to(a) for a in ledger.allocations],
    }


def ledger_from(raw: object) -> NodeLedger:
    r = Reader(raw)
    schema_of(raw)
    return NodeLedger(node_from(r.obj("node")), r.items("allocations", allocation_from))


def event_to(event: LedgerEvent) -> Json:
    return {
        "schema": SCHEMA,
        "kind": event.kind.value,
        "node": event.node,
        "revision": event.revision,
        "allocation": allocation_to(event.allocation) if event.allocation else None,
        "inventory": node_to(event.inventory) if event.inventory else None,
    }


def event_from(raw: object) -> LedgerEvent:
    r = Reader(raw)
    allocation = r.obj("allocation") if r.raw.get("allocation") is not None else None
    inventory = r.obj("inventory") if r.raw.get("inventory") is not None else None
    return LedgerEvent(
        kind=r.enum("kind", EventKind),
        node=NodeName(r.text("node")),
        revision=r.integer("revision", 0),
        allocation=allocation_from(allocation) if allocation else None,
        inventory=node_from(inventory) if inventory else None,
    )
