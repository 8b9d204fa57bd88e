"""Where a MIG instance goes: node, card and placement, chosen with a fragmentation measure over
MIG placements (docs/mig.md, "Choosing a placement").

A card in MIG mode is worth what it can still serve of the workload: for each profile the recent
workload asks for, weighed by how often it is asked (``MigWorkload``), the instances of it the
card could still give (its free instances of that profile, and the placements NVIDIA's rules still
allow: ``mig_layout.remaining``), times the profile's size. A choice costs what it takes from that
worth (``loss``); the choice is the one that costs least, as the ``default`` policy chooses for
shares by the fragmentation each choice adds. So a 1g goes where it blocks no larger profile the
workload wants (the last slice of a half already broken, not the first slice of an empty card);
an existing free instance goes before a new one on a tie (no reconfiguration); then the card with
the fewest free memory slices (packing), then the candidates' order and the lowest start.

Pure and memoised on what the worth depends on: the card model, what occupies the card, which of
its instances are free, and the workload.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuledger_core.mig import (
    free_instances,
    free_starts,
    model_of,
    occupied,
    placed,
    profile_for,
    smallest,
    unheld,
)
from gpuledger_core.mig_layout import remaining
from gpuledger_core.mig_profiles import MODELS, GiProfile, MigModel
from gpuledger_core.model import MIG_SMALLEST, Card, MigSlot, Request

MEMO_LIMIT = 65_536  # card states remembered per memo before starting afresh (a long-lived chooser)


@dataclass(frozen=True, slots=True)
class MigWorkload:
    """The profiles recently asked for (by name) and how often, summing to 1. Empty: every
    profile of the card's model without media engines, alike."""

    weights: tuple[tuple[str, float], ...] = ()

    @staticmethod
    def of(asked: Iterable[str]) -> MigWorkload:
        counts = Counter(asked)
        total = sum(counts.values())
        return MigWorkload(tuple(sorted((p, n / total) for p, n in counts.items())) if total else ())

    def on(self, model: MigModel) -> tuple[tuple[GiProfile, float], ...]:
        """The workload's profiles that ``model`` offers, with their weights."""
        if not self.weights:
            plain = [p for p in model.profiles if not p.name.endswith("+me")]
            return tuple((p, 1 / len(plain)) for p in plain)
        found = ((model.by_name(name), w) for name, w in self.weights)
        return tuple((p, w) for p, w in found if p is not None)


def profiles_asked(request: Request) -> tuple[str, ...]:
    """The profiles a MIG request asks for, by name: the one it names, or the smallest holding
    its memory and compute on each modelled card model (one each: the fleet's models decide which
    of them a card weighs)."""
    if request.mig != MIG_SMALLEST:
        return (request.mig,)
    return tuple(sorted({p.name for m in MODELS if (p := smallest(m, request.mem_mib, request.core_milli))}))


@dataclass(slots=True)
class MigAsks:
    """The MIG instances recently asked for, by profile: a sliding window of the last ``window``
    (as ``packing.WorkloadTracker`` keeps the recent asks for shares); ``version`` counts changes."""

    window: int = 5000
    version: int = 0
    _seen: deque[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._seen = deque(maxlen=self.window)

    def observe(self, request: Request) -> None:
        """Count a MIG request's instances (``request.count`` of each profile it means)."""
        names = profiles_asked(request)
        for _ in range(request.count):
            self._seen.extend(names)
        self.version += 1

    def workload(self) -> MigWorkload:
        return MigWorkload.of(self._seen)


@dataclass(frozen=True, slots=True)
class CardView:
    """A card in MIG mode as the choice sees it: the placements its holders hold."""

    card: Card
    held: tuple[MigSlot, ...] = ()

    def key(self) -> tuple[str, frozenset[MigSlot], frozenset[MigSlot], frozenset[MigSlot]]:
        """What the card's options and worth depend on (cards of one key are alike): the model,
        what occupies the card, its free instances, and which of those are static."""
        taken = frozenset(occupied(self.card, self.held))
        free = frozenset(unheld(self.card, self.held))
        fixed = frozenset(i.slot for i in self.card.instances if i.static)
        return (f"{self.card.model}/{self.card.memory_mib}", taken, free, fixed)

    def state(self) -> tuple[frozenset[MigSlot], frozenset[MigSlot]]:
        """The card as its worth counts it: what occupies it and its free instances, without the
        instances made on demand that nobody holds. Any placement over one of those destroys it
        (``reclaimed``), so it takes nothing the workload could have: a card holding only such
        instances is worth an empty card's. Counted as occupying, an idle 7g.40gb made the card
        worth nothing but that instance, and a small ask took a slice of it ahead of a card that
        held a pod already."""
        idle = frozenset(i.slot for i in self.card.instances if not i.static and i.slot not in self.held)
        return frozenset(occupied(self.card, self.held)) - idle, frozenset(unheld(self.card, self.held)) - idle


@dataclass(frozen=True, slots=True)
class Option:
    """Taking ``slot`` on a card: ``made`` when it is a new instance (a reconfiguration), ``loss``
    the worth it takes, ``free_slices`` the card's free memory slices before it."""

    slot: MigSlot
    made: bool
    loss: float
    free_slices: int

    def rank(self) -> tuple[float, bool, int, int]:
        return (round(self.loss, 9), self.made, self.free_slices, self.slot.start)


@dataclass(slots=True)
class MigChooser:
    """The choice, with its worth memoised per card state (``CardView.key``)."""

    workload: MigWorkload = MigWorkload()
    on_demand: bool = True  # may make new instances (else only free existing ones are taken)
    _worth: dict[object, float] = field(default_factory=dict)
    _best: dict[object, Option | None] = field(default_factory=dict)

    def worth(self, model: MigModel, taken: frozenset[MigSlot], free: frozenset[MigSlot]) -> float:
        """What the card can still serve of the workload, in memory slices weighed by popularity."""
        key = (model.name, taken, free)
        found = self._worth.get(key)
        if found is None:
            if len(self._worth) >= MEMO_LIMIT:
                self._worth.clear()
            blocking = placed(model, taken)
            found = sum(
                w * p.memory_slices * (remaining(model, p, blocking) + sum(1 for s in free if s.profile == p.name))
                for p, w in self.workload.on(model)
            )
            self._worth[key] = found
        return found

    def best(self, view: CardView, request: Request) -> Option | None:
        """The card's best option for one instance of what ``request`` asks; None: none fits."""
        card = view.card
        if not card.mig or not card.healthy or not request.allows(card.model):
            return None  # before the memo: its key holds neither the mode nor the health
        key = (view.key(), request.mig, request.mem_mib, request.core_milli)
        if key in self._best:
            return self._best[key]
        if len(self._best) >= MEMO_LIMIT:
            self._best.clear()
        found = self._best[key] = self._best_of(view, request)
        return found

    def _best_of(self, view: CardView, request: Request) -> Option | None:
        card, model = view.card, model_of(view.card)
        if model is None:
            return None
        profile = profile_for(model, request)
        if profile is None:
            return None
        taken, free = view.state()
        before = self.worth(model, taken, free)
        free_slices = model.memory_slices - sum(s.size for s in taken)
        options = [
            Option(s, False, before - self.worth(model, taken | {s}, free - {s}), free_slices)
            for s in free_instances(card, view.held, profile.name)
        ]
        if self.on_demand:
            for start in free_starts(card, model, profile, view.held):
                slot = MigSlot(profile.name, start, profile.memory_slices)
                options.append(Option(slot, True, before - self.worth(model, taken | {slot}, free), free_slices))
        return min(options, key=Option.rank, default=None)

    def choose(self, views: Sequence[CardView], request: Request) -> tuple[int, Option] | None:
        """The position of the card among ``views`` and the option taken there; None: none fits."""
        best: tuple[tuple[float, bool, int, int], int, Option] | None = None
        for at, view in enumerate(views):
            option = self.best(view, request)
            if option is None:
                continue
            rank = option.rank()
            if best is None or (rank[:3], at) < (best[0][:3], best[1]):
                best = (rank, at, option)
        return None if best is None else (best[1], best[2])
