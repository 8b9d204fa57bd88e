"""Expected GPU fragmentation of a node against a workload of typical pods (the FGD measure).

For a node and a typical pod *m*: if the node cannot host *m* (CPU short, not enough cards with room
for *m*'s per-card share, or no card of an allowed model), or *m* wants no card, all the node's idle
GPU is fragment for *m*; otherwise the fragment is the room of the cards too small for *m*. The
node's fragmentation is the popularity-weighted sum over the typical pods. Everything is in
per-mille of a card; memory is folded into a card's room (see ``CardState.room``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpuledger_core.packing.ask import Ask
from gpuledger_core.packing.state import UNTRACKED, NodeState

POPULARITY_COVER = 0.95  # typical pods: the most frequent shapes covering this share of all pods


@dataclass(frozen=True, slots=True)
class TypicalPod:
    cpu_milli: int
    count: int  # cards; 0 for a pod that wants none
    milli: int  # per-card share, per-mille (1000: whole cards)
    models: frozenset[str] = frozenset()
    memory_mib: int = 0  # node memory; the FGD paper leaves it out (0)


@dataclass(frozen=True, slots=True)
class Workload:
    """Typical pods and their popularity (summing to 1)."""

    pods: tuple[tuple[TypicalPod, float], ...]

    @staticmethod
    def of(asks: Iterable[TypicalPod], cover: float = POPULARITY_COVER) -> Workload:
        """The most frequent shapes until ``cover`` of all pods is reached, renormalised.

        Ties in frequency go larger shape first, so the result does not depend on input order.
        """
        counts = Counter(asks)
        total = sum(counts.values())
        if not total:
            return Workload(())
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], _order(kv[0])), reverse=True)
        chosen: list[tuple[TypicalPod, int]] = []
        covered = 0
        for pod, n in ranked:
            if covered >= cover * total:
                break
            chosen.append((pod, n))
            covered += n
        return Workload(tuple((pod, n / covered) for pod, n in chosen))


def without_memory(pods: Iterable[TypicalPod]) -> list[TypicalPod]:
    """The shapes as the FGD paper counts them: by CPU, cards and model, not by memory."""
    return [replace(pod, memory_mib=0) for pod in pods]


def _order(pod: TypicalPod) -> tuple[int, int, int, str, int]:
    return (pod.cpu_milli, pod.milli, pod.count, "|".join(sorted(pod.models)), pod.memory_mib)


def typical(ask: Ask, mem_total: int = 0, with_memory: bool = True) -> TypicalPod:
    """The typical-pod shape of an observed ask (memory shares sized against ``mem_total``)."""
    memory = ask.memory_mib if with_memory else 0
    return TypicalPod(ask.cpu_milli, ask.count, ask.size_on(mem_total), ask.models, memory)


@dataclass(slots=True)
class WorkloadTracker:
    """Keeps the typical pods up to date from a sliding window of observed asks."""

    window: int = 5000
    cover: float = POPULARITY_COVER
    _seen: list[TypicalPod] = field(default_factory=list)
    _next: int = 0
    version: int = 0

    def observe(self, pod: TypicalPod) -> None:
        if len(self._seen) < self.window:
            self._seen.append(pod)
        else:
            self._seen[self._next] = pod
            self._next = (self._next + 1) % self.window
        self.version += 1

    def seen(self) -> tuple[TypicalPod, ...]:
        return tuple(self._seen)


class FragMeter:
    """Computes node fragmentation for one workload, memoised on what the measure depends on:
    the node's models, which typical pods its free CPU and memory can host, its card rooms."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._cpu = _Levels(pod.cpu_milli for pod, _ in workload.pods)
        self._mem = _Levels(pod.memory_mib for pod, _ in workload.pods)
        self._memo: dict[tuple[object, ...], float] = {}

    def node(self, node: NodeState) -> float:
        return self.of(node.models, node.cpu_free, node.rooms, _models_of(node), node.mem_free)

    def of(
        self,
        models: frozenset[str],
        cpu_free: int,
        rooms: tuple[int, ...],
        card_models: tuple[str, ...] | None = None,
        mem_free: int = UNTRACKED,
    ) -> float:
        """Fragmentation of a node with these card ``rooms`` (and per-card models if mixed)."""
        cpu, mem = self._cpu.level(cpu_free), self._mem.level(mem_free)
        if card_models is None:
            key: tuple[object, ...] = (models, cpu, mem, tuple(sorted(rooms)))
        else:
            key = (cpu, mem, tuple(sorted(zip(card_models, rooms, strict=True))))
        found = self._memo.get(key)
        if found is None:
            host = (self._cpu.value(cpu), self._mem.value(mem))
            found = self._compute(models, host, rooms, card_models)
            self._memo[key] = found
        return found

    def _compute(
        self,
        models: frozenset[str],
        host: tuple[int, int],
        rooms: tuple[int, ...],
        card_models: tuple[str, ...] | None,
    ) -> float:
        total = sum(rooms)
        if total == 0:
            return 0.0
        frag = 0.0
        for pod, weight in self.workload.pods:
            frag += weight * _frag_for(pod, models, host, rooms, card_models, total)
        return frag


class _Levels:
    """The distinct values typical pods ask of one node resource: a node's free amount matters
    only through the largest of them it still covers."""

    def __init__(self, asked: Iterable[int]) -> None:
        self._values = sorted(set(asked))

    def level(self, free: int) -> int:
        return len(self._values) if free == UNTRACKED else bisect_right(self._values, free)

    def value(self, level: int) -> int:
        return self._values[level - 1] if level else -1


def _frag_for(
    pod: TypicalPod,
    models: frozenset[str],
    host: tuple[int, int],
    rooms: tuple[int, ...],
    card_models: tuple[str, ...] | None,
    total: int,
) -> int:
    if pod.count == 0 or host[0] < pod.cpu_milli or host[1] < pod.memory_mib:
        return total
    if card_models is None:
        if pod.models and not (pod.models & models):
            return total
        usable = [room for room in rooms if room >= pod.milli]
    else:
        usable = [
            room
            for room, model in zip(rooms, card_models, strict=True)
            if room >= pod.milli and (not pod.models or model in pod.models)
        ]
    if len(usable) < pod.count:
        return total
    return total - sum(usable)


def _models_of(node: NodeState) -> tuple[str, ...] | None:
    models = tuple(card.model for card in node.cards)
    return None if len(set(models)) <= 1 else models
