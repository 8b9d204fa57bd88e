"""The identity memo under slots and card use: made once per object, never for another object,
even an equal one, and bounded."""

from __future__ import annotations

from gpuledger_core.memo import Memo


class Thing:
    def __init__(self, value: int) -> None:
        self.value = value


def test_a_value_is_made_once_per_object() -> None:
    made: list[int] = []
    memo: Memo[Thing, int] = Memo()

    def make(thing: Thing) -> int:
        made.append(thing.value)
        return thing.value * 2

    first = Thing(1)
    assert memo.get(first, make) == 2
    assert memo.get(first, make) == 2
    assert memo.get(Thing(1), make) == 2  # another object: made again
    assert made == [1, 1]


def test_a_full_memo_starts_afresh() -> None:
    memo: Memo[Thing, int] = Memo(kept=2)
    things = [Thing(i) for i in range(3)]
    for thing in things:
        memo.get(thing, lambda t: t.value)
    assert len(memo) == 1  # cleared when the third came


def test_a_remembered_object_is_kept_alive_so_its_identity_is_not_reused() -> None:
    memo: Memo[Thing, int] = Memo()
    memo.get(Thing(7), lambda t: t.value)
    other = Thing(8)  # may not take the remembered object's id: that one is still alive
    assert memo.get(other, lambda t: t.value) == 8
