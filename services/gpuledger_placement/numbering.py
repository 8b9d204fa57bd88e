"""Small numbers standing for what placement's memos are keyed by (pure): a question asked of every
node, and what a single ask's score of a node depends on. Cheap to look up in each of 800 node memos;
numbers are never reused (one counter for both), so a forgotten question or content cannot alias
another."""

from __future__ import annotations

from itertools import count

from gpuledger_placement.view import NodeEntry

KEYS_KEPT = 4096  # distinct questions remembered before starting afresh
CONTENT = -1  # a node entry's memo key for the number standing for its content (question keys are >= 0)
CONTENTS_KEPT = 65_536


class Numbering:
    def __init__(self) -> None:
        self._next = count()
        self._questions: dict[object, int] = {}
        self._contents: dict[object, int] = {}

    def question(self, question: object) -> int:
        """The number standing for a (hashable, nested) question."""
        found = self._questions.get(question)
        if found is None:
            if len(self._questions) > KEYS_KEPT:
                self._questions.clear()
            found = self._questions[question] = next(self._next)
        return found

    def content(self, entry: NodeEntry) -> object:
        """A number standing for what a single ask's score of the node depends on (nodes alike
        in it score alike), made once per entry: hashing the cards and interconnect costs."""
        found = entry.memo.get(CONTENT)
        if found is None:
            content = _content_of(entry)
            found = self._contents.get(content)
            if found is None:
                if len(self._contents) > CONTENTS_KEPT:
                    self._contents.clear()
                found = self._contents[content] = next(self._next)
            entry.remember(CONTENT, found)
        return found


def _content_of(entry: NodeEntry) -> object:
    state = entry.state
    return (
        state.cards,
        state.cpu_free,
        state.mem_free,
        state.cpu_total,
        state.mem_total,
        state.stale,
        state.tags,
        state.topology,
    )


def alone(entry: NodeEntry) -> object | None:
    """Pods of several containers are planned on the node's ledger: no two nodes share a score."""
    return None
