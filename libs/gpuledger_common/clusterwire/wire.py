"""Protobuf's wire format, one field at a time: the writing of a field and the reading of one
message's fields, shared by the messages of ``clusterwire``.

A writer appends a field's parts to a list of byte strings and leaves out a field at its default
value, as proto3 and betterproto do. The reader skips fields it does not know (a newer server may
send more) and refuses, naming the field, a value of the wrong wire type or bytes that end too
early.
"""

from __future__ import annotations

import struct

from gpuledger_core.errors import InvalidArgument

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
MASK64 = (1 << 64) - 1
DOUBLE = struct.Struct("<d")
_SMALL = [bytes([n]) for n in range(128)]

# --- writing ---


def varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL[value]
    value &= MASK64  # a negative int32 or int64 goes as its 64-bit two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def text(out: list[bytes], field: int, value: str) -> None:
    if value:
        data = value.encode()
        out += (key(field, LENGTH), varint(len(data)), data)


def number(out: list[bytes], field: int, value: int) -> None:
    if value:
        out += (key(field, VARINT), varint(value))


def flag(out: list[bytes], field: int, value: bool) -> None:
    if value:
        out += (key(field, VARINT), b"\x01")


def double(out: list[bytes], field: int, value: float) -> None:
    if value:
        out += (key(field, FIXED64), DOUBLE.pack(value))


def message(out: list[bytes], field: int, body: bytes) -> None:
    out += (key(field, LENGTH), varint(len(body)), body)


# --- reading ---


class Reader:
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
            tag = self.varint()
            field, wire = tag >> 3, tag & 7
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


def values_of(data: bytes, path: str, spec: Spec) -> dict[str, object]:
    """The known fields of the message in ``data`` by name (a repeated field: every value in a
    list); a known field of the wrong wire type is refused by name, unknown fields are skipped."""
    values: dict[str, object] = {}
    for field, wire, value in Reader(data, path).fields():
        known = spec.get(field)
        if known is None:
            continue
        name, expected = known
        if wire != expected:
            raise InvalidArgument(f"{path}.{name}", f"has wire type {wire}, expected {expected}")
        if name.endswith("[]"):
            repeated = values.setdefault(name, [])
            assert isinstance(repeated, list)
            repeated.append(value)
        else:
            values[name] = value
    return values


def string(values: dict[str, object], name: str, path: str) -> str:
    raw = values.get(name, b"")
    assert isinstance(raw, bytes)
    return text_of(raw, f"{path}.{name}")


def text_of(raw: bytes, path: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as err:
        raise InvalidArgument(path, f"is not UTF-8: {err}") from None


def uint(values: dict[str, object], name: str) -> int:
    raw = values.get(name, 0)
    assert isinstance(raw, int)
    return raw


def uint32(values: dict[str, object], name: str) -> int:
    return uint(values, name) & 0xFFFFFFFF  # protobuf keeps a 32-bit field's low 32 bits


def int32(values: dict[str, object], name: str) -> int:
    raw = uint32(values, name)
    return raw - (1 << 32) if raw >= 1 << 31 else raw


def items(values: dict[str, object], name: str) -> list[bytes]:
    found = values.get(name, [])
    assert isinstance(found, list)
    return found
