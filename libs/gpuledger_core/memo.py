"""What is derived from an immutable object, remembered by the object's identity.

A node's ledger changes one allocation at a time, and the store hands out the same decoded
``Allocation`` objects for the allocations a change left alone, so a node state made again (placement
makes one per change of a node and per pod it assumes there) meets mostly objects it has counted
before. Looking them up by identity costs no hashing of their nested fields. Each remembered value
keeps its object alive, so an identity is never reused while it is remembered; past ``kept``
objects the memo starts afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
KEPT = 4096


class Memo(Generic[K, V]):
    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._found: dict[int, tuple[K, V]] = {}

    def get(self, key: K, make: Callable[[K], V]) -> V:
        """``make(key)``, made once while ``key`` (this very object) is remembered."""
        found = self._found.get(id(key))
        if found is not None and found[0] is key:
            return found[1]
        value = make(key)
        if len(self._found) >= self._kept:
            self._found.clear()
        self._found[id(key)] = (key, value)
        return value

    def __len__(self) -> int:
        return len(self._found)
