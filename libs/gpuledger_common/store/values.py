"""Ledger values as bytes and back, with what this process last decoded or wrote of each node kept
to make the next one cheap: our own recent writes by their bytes (a watch brings them back already
decoded), each node's inventory with its JSON (decoded once per change, spliced into each write),
and each node's allocations with their JSON (``splice``: another writer's value is parsed only where
it changed; an allocation that is the same object as before is not encoded again).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import orjson

from gpuledger_common.bus import encode
from gpuledger_common.store.splice import Part, spliced
from gpuledger_core import codec
from gpuledger_core.errors import GpuledgerError, InvalidArgument
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, Node

log = logging.getLogger(__name__)
WRITES_REMEMBERED = 8


class UnreadableValue(InvalidArgument):
    """A node's value, as a watch or a snapshot brought it, that cannot be read (``unreadable``)."""


@dataclass(slots=True)
class Inventory:
    """One node's inventory, with its JSON as a value holds it: a value that begins with
    ``prefix`` carries this inventory, and a write splices ``fragment`` in."""

    node: Node
    json: bytes
    prefix: bytes = field(init=False)
    fragment: orjson.Fragment = field(init=False)
    schema: int = field(init=False)  # what a value of this inventory is written in (codec.node_schema)

    def __post_init__(self) -> None:
        self.schema = codec.node_schema(self.node)
        self.prefix = b'{"schema":%d,"node":' % self.schema + self.json + b',"allocations":'
        self.fragment = orjson.Fragment(self.json)


@dataclass(slots=True)
class Values:
    written: dict[str, dict[bytes, NodeLedger]] = field(default_factory=dict)  # our last writes, by their bytes
    inventory: dict[str, Inventory] = field(default_factory=dict)  # each node's inventory, with its JSON
    parts: dict[str, dict[object, Part]] = field(default_factory=dict)  # each node's allocations, with their JSON
    newer: dict[str, int] = field(default_factory=dict)  # nodes whose value is of a newer schema: read, not written

    def watched(self, node: str, data: bytes | None, operation: str | None) -> NodeLedger | None:
        """A key's value as a watch delivers it: None for a deleted (or purged) key. Decoded as
        a read decodes (the node's inventory once per change, unchanged allocations reused); a
        value that cannot be read is ``UnreadableValue``."""
        if operation in ("DEL", "PURGE") or not data:
            return None
        try:
            return self.decoded(node, data)
        except InvalidArgument as err:
            raise UnreadableValue(err.field, err.problem) from err
        except GpuledgerError as err:
            raise UnreadableValue("ledger value", str(err)) from err

    def decoded(self, node: str, data: bytes) -> NodeLedger:
        """The ledger in ``data``. Our own recent writes come back from a watch already decoded.
        The node's inventory, which seldom changes, is decoded once per change, and while the
        value begins with the same inventory bytes only its allocations are parsed."""
        mine = self.written.get(node, {}).get(data)  # the same bytes are the same value
        if mine is not None:
            self.newer.pop(node, None)
            return mine
        inventory = self.inventory.get(node)
        if inventory is not None and data.startswith(inventory.prefix) and data.endswith(b"}"):
            self.newer.pop(node, None)  # the prefix holds our schema
            pieces = spliced(self.parts.get(node), data, len(inventory.prefix))
            if pieces is not None:
                return NodeLedger(inventory.node, self._allocations_from(node, *pieces))
            try:
                items = orjson.loads(data[len(inventory.prefix) : -1])
            except orjson.JSONDecodeError:  # more follows the allocations: read the whole value
                items = None
            if isinstance(items, list):
                return NodeLedger(inventory.node, self._allocations_from(node, items))
        raw = parsed(data)
        if not isinstance(raw, dict) or not isinstance(raw.get("node"), dict):
            return codec.ledger_from(raw)  # says what is wrong
        schema = codec.schema_of(raw)
        if schema > codec.KNOWN:  # read as far as this code knows it; never written back
            if self.newer.get(node) != schema:
                log.warning("the ledger of %s is in schema %d, newer than this one's %d", node, schema, codec.KNOWN)
            self.newer[node] = schema
        else:
            self.newer.pop(node, None)
        json = encode(raw["node"])
        if inventory is None or inventory.json != json:
            inventory = self.inventory[node] = Inventory(codec.node_from(codec.Reader(raw).obj("node")), json)
        return NodeLedger(inventory.node, self._allocations_from(node, raw.get("allocations")))

    def _allocations_from(
        self,
        node: str,
        items: object,
        head: list[Part] | None = None,
        tail: list[Part] | None = None,
    ) -> tuple[Allocation, ...]:
        """Decoded allocations: ``head``, then ``items``, then ``tail``. Those of the node's last
        value, decoded or written here, are reused when their JSON is equal: another writer's
        change touches one or two of them."""
        if items is None:
            items = []
        if not isinstance(items, list):
            raise InvalidArgument("allocations", f"must be a list, got {type(items).__name__}")
        before = self.parts.get(node, {})
        now: dict[object, Part] = {}
        order = list(head or ())
        for item in items:
            part = before.get(item.get("id")) if isinstance(item, dict) else None
            if part is None or part.raw != item:
                part = Part(codec.allocation_from(codec.Reader(item, f"allocations[{len(order)}]")), item)
            order.append(part)
        order.extend(tail or ())
        for part in order:
            now[part.allocation.id] = part
        self.parts[node] = now
        return tuple(part.allocation for part in order)

    def encoded(self, ledger: NodeLedger) -> bytes:
        """The ledger's bytes, as ``codec.ledger_to`` spells it. Parts already encoded for an
        earlier write are reused: the node's inventory, and each allocation that is the same
        object as before (they are immutable; a write changes one or two of them)."""
        name = ledger.node.name
        inventory = self.inventory.get(name)
        if inventory is None or (inventory.node is not ledger.node and inventory.node != ledger.node):
            inventory = self.inventory[name] = Inventory(ledger.node, encode(codec.node_to(ledger.node)))
        before = self.parts.get(name, {})
        now: dict[object, Part] = {}
        for a in ledger.allocations:
            part = before.get(a.id)
            if part is None or part.allocation is not a:
                part = Part(a, codec.allocation_to(a))
            if part.fragment is None:
                part.fragment = orjson.Fragment(part.encoded())
            now[a.id] = part
        self.parts[name] = now
        parts = [part.fragment for part in now.values()]
        return encode({"schema": inventory.schema, "node": inventory.fragment, "allocations": parts})


def parsed(data: bytes, what: str = "ledger value") -> object:
    """``data``'s JSON; ``InvalidArgument`` naming ``what`` when it is none."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise InvalidArgument(what, f"not valid JSON: {err}") from err
