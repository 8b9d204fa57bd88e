"""A node's value read in pieces against its last one: the allocations whose JSON stands unchanged
at the front or the back of the new array are kept, and only the bytes between them are parsed
(docs/ledger.md, "Another writer's value is parsed where it changed"). ``Part`` is one allocation
of a value with its JSON, as ``values`` decodes and encodes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gpuledger_common.bus import encode
from gpuledger_core.model import Allocation

_OPEN, _COMMA = ord("["), ord(",")
SPLICE_FROM = 4  # the fewest allocations a node's last value must hold for its next to be read in pieces


@dataclass(slots=True)
class Part:
    """One allocation of a node's value, with its JSON as decoded or encoded here; ``json`` is
    ``raw`` as ``encode`` spells it (made when first needed)."""

    allocation: Allocation
    raw: object
    fragment: orjson.Fragment | None = None
    json: bytes | None = None

    def encoded(self) -> bytes:
        if self.json is None:
            self.json = encode(self.raw)
        return self.json


def spliced(
    parts: dict[object, Part] | None, data: bytes, at: int
) -> tuple[list[object], list[Part], list[Part]] | None:
    """A value's allocations (its array starts at ``data[at]``): the items parsed, and the
    node's last ``parts`` unchanged before them and after them.

    Another writer's change adds, changes or drops one or two allocations: the last value's
    parts whose bytes follow one another from the front of the array, or from its back, are
    kept (those not found there were dropped or changed), and only the bytes between them
    are parsed. None when they do not line up, or when the last value held fewer than
    ``SPLICE_FROM`` (parsing a short array whole costs less): the whole array is read."""
    if parts is None or len(parts) < SPLICE_FROM or data[at] != _OPEN or not data.endswith(b"]}"):
        return None
    last = list(parts.values())  # in the order of the value they came in
    content = data[at + 1 : -2]  # the items between the array's brackets, comma separated
    size, head, start, after = len(content), [], 0, 0
    for i, part in enumerate(last):  # from the front
        json = part.encoded()
        end = start + len(json)
        if content.startswith(json, start) and (end == size or (end < size and content[end] == _COMMA)):
            head.append(part)
            start, after = end + 1, i + 1
    tail, end = [], size
    for part in reversed(last[after:]):  # from the back, among those after the front's
        json = part.encoded()
        begin = end - len(json)
        if begin >= start and content.endswith(json, begin, end) and (begin == 0 or content[begin - 1] == _COMMA):
            tail.append(part)
            end = begin - 1
    tail.reverse()
    if end == start - 1:  # nothing between: allocations were only dropped
        return [], head, tail
    middle = content[start:end] if end > start else b""
    try:
        items = orjson.loads(b"[" + middle + b"]")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(items, list) or not items:  # "[]": two commas with nothing between
        return None
    return items, head, tail
