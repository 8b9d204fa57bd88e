"""A ledger value as the store reads it from a watch equals the value read afresh, whatever the
store read or wrote before: another writer's value is parsed only where its bytes differ from
the node's last value (``splice.spliced``), which must never change what it means."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuledger_common.store.values import Values
from gpuledger_core import codec
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import AllocState, Grant, Owner, OwnerKind

from ..core.builders import NODE, allocation, ledger, share

BASE = ledger(8000, 8000)
TRICKY = ["a", "},{", '"]', ",", "]}", "\\", "é", "x" * 40, ""]


@st.composite
def allocations(draw: st.DrawFn) -> dict[str, Any]:
    """An allocation's JSON: a handful of ids (so values share and change them), owner names that
    look like the value's own punctuation, a share of one card, a state."""
    made = allocation(
        f"a{draw(st.integers(0, 6))}",
        Grant("main", (share(draw(st.integers(0, 1)), draw(st.sampled_from([0, 1000, 4000])), 100),)),
        state=draw(st.sampled_from([AllocState.RESERVED, AllocState.BOUND, AllocState.RELEASED])),
        created_at=draw(st.sampled_from([0.0, 1.5, 1796422427.1337347])),
    )
    owner = Owner(OwnerKind.POD, draw(st.sampled_from(TRICKY[:-1])), "default", draw(st.sampled_from(TRICKY)))
    raw = codec.allocation_to(dataclasses.replace(made, owner=owner))
    assert isinstance(raw, dict)
    return raw


A, B, C, D, M = (codec.allocation_to(allocation(f"a{i}", Grant("main", (share(0, 1000, 100),)))) for i in range(5))
items = st.one_of(allocations(), allocations(), allocations(), st.sampled_from([1, None, [], {}, "a", {"id": "a1"}]))
# Bytes a writer gone wrong might leave (a node may write any bytes to its key), at or beside a
# boundary between items, where a value read in pieces could go wrong.
damage = st.one_of(
    st.none(),
    st.none(),
    st.tuples(st.integers(0, 8), st.integers(-1, 1), st.sampled_from([b",", b"x", b" ", b"}", b"]", b",,", b'"', b""])),
)
# Each step changes the last value's allocations as writers do (one added, changed or dropped;
# sometimes all new), and reads or writes the result.
edits = st.tuples(
    st.sampled_from(["add", "change", "drop", "drop", "anew"]), st.integers(0, 8), st.lists(items, max_size=8)
)
steps = st.lists(
    st.tuples(
        st.sampled_from(["read", "read", "read", "write"]),
        st.lists(edits, min_size=1, max_size=2),
        st.sampled_from(["orjson", "orjson", "orjson", "orjson", "spaced", "more"]),
        damage,
    ),
    min_size=1,
    max_size=12,
)


def edited(allocs: list[Any], edit: tuple[str, int, list[Any]]) -> list[Any]:
    kind, at, new = edit
    at = at % (len(allocs) + 1)
    if kind == "anew":
        return new
    if kind == "add":
        return [*allocs[:at], *new[:1], *allocs[at:]]
    if kind == "change":
        return [*allocs[:at], *new[:1], *allocs[at + 1 :]]
    return [*allocs[:at], *allocs[at + 1 :]]


def spelled(allocs: list[Any], how: str) -> bytes:
    """The node's value with these allocations, written as a writer might: as the store writes
    (orjson), with spaces (another JSON writer), or with a field after the allocations."""
    value = {**codec.ledger_to(BASE), "allocations": allocs}
    if how == "spaced":
        return json.dumps(value, ensure_ascii=False).encode()
    if how == "more":
        return orjson.dumps({**value, "more": [1]})
    return orjson.dumps(value)


def damaged(data: bytes, how: tuple[int, int, bytes] | None) -> bytes:
    """``data`` with the byte at (or beside) a boundary of its allocations replaced: a comma
    between two items, or a bracket of the array."""
    if how is None:
        return data
    start = data.index(b'"allocations":') + len(b'"allocations":')
    bounds, depth, quoted, escaped = [], 0, False, False
    for i in range(start, len(data)):
        c = data[i : i + 1]
        if quoted:
            quoted, escaped = (escaped or c != b'"'), (not escaped and c == b"\\")
        elif c == b'"':
            quoted = True
        elif c in b"[{":
            depth += 1
            bounds += [i] if depth == 1 else []
        elif c in b"]}":
            bounds += [i] if depth == 1 else []
            depth -= 1
            if depth == 0:
                break
        elif c == b"," and depth == 1:
            bounds.append(i)
    at = bounds[how[0] % len(bounds)] + how[1]
    return data[:at] + how[2] + data[at + 1 :]


def afresh(data: bytes) -> NodeLedger | type[GpuledgerError]:
    try:
        return codec.ledger_from(orjson.loads(data))
    except (GpuledgerError, orjson.JSONDecodeError):
        return GpuledgerError


def as_store_reads(store: Values, data: bytes) -> NodeLedger | type[GpuledgerError]:
    try:
        return store.decoded(NODE, data)
    except GpuledgerError:
        return GpuledgerError


@settings(max_examples=400)
@given(steps)
@example([("read", [("anew", 0, [])], "orjson", None), ("read", [("add", 0, [{"id": "a1"}])], "orjson", None)])
# [A, B, C, D] read, then [A, B, M, C, D] with a byte that is not a comma after M, or before it: no items
@example([("read", [("anew", 0, [A, B, C, D])], "orjson", None), ("read", [("add", 2, [M])], "orjson", (3, 0, b"x"))])
@example([("read", [("anew", 0, [A, B, C, D])], "orjson", None), ("read", [("add", 2, [M])], "orjson", (2, 0, b"x"))])
# [A, B, C, D] read, then "A,B,,C,D": nothing between the items kept, and not no items either
@example([("read", [("anew", 0, [A, B, C, D])], "orjson", None), ("read", [("add", 0, [])], "orjson", (2, 0, b",,"))])
def test_each_value_reads_as_it_would_afresh(history: list[tuple[str, list[Any], str, Any]]) -> None:
    store = Values()  # decoding and encoding only: no I/O
    allocs: list[Any] = []
    for action, changes, how, harm in history:
        for change in changes:
            allocs = edited(allocs, change)
        data = damaged(spelled(allocs, how), harm)
        expected = afresh(data)
        if action == "write" and isinstance(expected, NodeLedger):  # this store's own write of it
            store.encoded(expected)
            continue
        assert as_store_reads(store, data) == expected, (action, allocs, how, harm)


def test_a_value_that_changes_one_allocation_reuses_the_others() -> None:
    store = Values()
    raws = [codec.allocation_to(allocation(f"a{i}", Grant("main", (share(i % 2, 1000, 100),)))) for i in range(5)]
    first = store.decoded(NODE, spelled(raws, "orjson"))
    changed = [*raws[:2], {**raws[2], "state": "bound"}, *raws[3:]]
    second = store.decoded(NODE, spelled(changed, "orjson"))
    assert second == codec.ledger_from(orjson.loads(spelled(changed, "orjson")))
    assert [a is b for a, b in zip(first.allocations, second.allocations, strict=True)] == [
        True,
        True,
        False,
        True,
        True,
    ]
