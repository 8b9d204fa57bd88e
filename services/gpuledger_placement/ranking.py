"""Every node's score for one question, kept current as nodes change, best first on demand.

``place`` wants the few best nodes of thousands. Rating and sorting every node on every request
costs milliseconds per request at 5,000 nodes; a ``Ranking`` instead rates each node once, again
only when the view reports it changed, and keeps the scores in a heap (entries of nodes rated
again are skipped when they surface, and the heap is compacted now and then), so a request pops
the best few. Identical nodes (same free cards, CPU, memory, tags, interconnect) are rated once.

When the policy is rebuilt (its workload changed), the ranking under the new policy is built a
slice at a time (``step``: by each request, or between requests with ``Rankings.build``), while
requests are answered from the old one: a rebuild never stalls a request. Nothing here does I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuledger_placement.view import NodeEntry

Rate = Callable[[NodeEntry], float | None]  # the policy's raw score of a node (None: does not fit)
Content = Callable[[NodeEntry], object | None]  # what the score depends on, or None: rate each node alone
COMPACT_SLACK = 2  # rebuild the heap once it holds this many times the rated nodes


@dataclass(slots=True)
class Ranking:
    rate: Rate
    content: Content
    scores: dict[str, float] = field(default_factory=dict)  # fitting nodes only
    dirty: set[str] = field(default_factory=set)  # changed since rated (or never rated)
    _heap: list[tuple[float, int, str]] = field(default_factory=list)
    _order: dict[str, int] = field(default_factory=dict)  # tie-break: the caller's node order
    _memo: dict[object, float | None] = field(default_factory=dict)

    def changed(self, name: str) -> None:
        self.dirty.add(name)

    def step(self, entries: dict[str, NodeEntry], order: dict[str, int], budget: int | None = None) -> bool:
        """Rate up to ``budget`` (all if None) of the nodes changed since; True when none is left."""
        while self.dirty and (budget is None or budget > 0):
            name = self.dirty.pop()
            self._rate(name, entries.get(name), order.get(name, 0))
            if budget is not None:
                budget -= 1
        if len(self._heap) > COMPACT_SLACK * len(self.scores) + 64:
            self._heap = [(-score, self._order[name], name) for name, score in self.scores.items()]
            heapq.heapify(self._heap)
        return not self.dirty

    def best(self, count: int, skip: Callable[[str], bool]) -> list[tuple[float, int, str]]:
        """The ``count`` best fitting nodes (score, order, name; highest score, then lowest order),
        passing over those ``skip`` names. Call ``step`` first."""
        found: list[tuple[float, int, str]] = []
        popped: list[tuple[float, int, str]] = []
        seen: set[str] = set()
        while self._heap and len(found) < count:
            item = heapq.heappop(self._heap)
            negative, order, name = item
            if name in seen or self.scores.get(name) != -negative or self._order.get(name) != order:
                continue  # superseded by a later rating of the node (or it no longer fits)
            seen.add(name)
            popped.append(item)
            if not skip(name):
                found.append((-negative, order, name))
        for item in popped:
            heapq.heappush(self._heap, item)
        return found

    def _rate(self, name: str, entry: NodeEntry | None, order: int) -> None:
        score = None if entry is None else self._score(entry)
        if score is None:
            self.scores.pop(name, None)
            return
        if self.scores.get(name) == score and self._order.get(name) == order:
            return
        self.scores[name], self._order[name] = score, order
        heapq.heappush(self._heap, (-score, order, name))

    def _score(self, entry: NodeEntry) -> float | None:
        key = self.content(entry)
        if key is None:
            return self.rate(entry)
        if key not in self._memo:
            if len(self._memo) >= 4 * len(self.scores) + 1024:
                self._memo.clear()
            self._memo[key] = self.rate(entry)
        return self._memo[key]


@dataclass(slots=True)
class Question:
    """One question's ranking under the current policy, and the next one while it is built."""

    key: object
    current: Ranking
    building: Ranking | None = None
    building_key: object = None


@dataclass(slots=True)
class Rankings:
    """A ranking per question (pod shape and policy), told of every changed node."""

    limit: int = 32
    _questions: dict[object, Question] = field(default_factory=dict)

    def changed(self, name: str) -> None:
        for question in self._questions.values():
            question.current.changed(name)
            if question.building is not None:
                question.building.changed(name)

    def ranking(
        self,
        question: object,
        policy_key: object,
        make: Callable[[], Ranking],
        names: Iterable[str],
        entries: dict[str, NodeEntry],
        order: dict[str, int],
        budget: int,
    ) -> Ranking:
        """The ranking to answer from, current with the view: under ``policy_key`` once built
        (the first ranking of a question is built at once), under the previous policy until then."""
        found = self._questions.pop(question, None)
        if found is None:
            ranking = make()
            ranking.dirty.update(names)
            found = Question(policy_key, ranking)
        elif found.key != policy_key:
            if found.building is None or found.building_key != policy_key:
                found.building, found.building_key = make(), policy_key
                found.building.dirty.update(names)
            if found.building.step(entries, order, budget):
                found.key, found.current, found.building = policy_key, found.building, None
        self._questions[question] = found  # most recently used last
        while len(self._questions) > self.limit:
            del self._questions[next(iter(self._questions))]
        found.current.step(entries, order)
        return found.current

    def build(self, entries: dict[str, NodeEntry], order: dict[str, int], budget: int) -> bool:
        """Rate up to ``budget`` nodes of the rankings being built under a rebuilt policy, and put
        each one that is done in place of the old; True while some are still being built."""
        for question in self._questions.values():
            building = question.building
            if building is None:
                continue
            before = len(building.dirty)
            if building.step(entries, order, budget):
                question.key, question.current, question.building = question.building_key, building, None
            budget -= before - len(building.dirty)
            if budget <= 0:
                break
        return any(question.building is not None for question in self._questions.values())

    def forget(self) -> None:
        self._questions.clear()
