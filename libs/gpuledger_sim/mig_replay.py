"""The openb trace replayed as MIG (``gpuledger sim --mig``): its GPU pods as MIG instances on its
nodes' cards, each card taken as an A100-SXM4-40GB, in the arrival order of ``replay.prepare``.

Each pod asks, on each of its ``num_gpu`` cards, for the smallest A100 40 GB profile that holds
its share (``mig.smallest``): ``gpu_milli`` is the share of one card's compute and memory together,
so ``gpu_milli / 1000`` of the compute slices (7) and of the card's 40960 MiB. A whole card is a
7g.40gb; 1g.5gb holds up to 118 per-mille, 1g.10gb up to 142, 2g.10gb up to 240, 3g.20gb up to
428, 4g.20gb up to 487, anything above a 7g.40gb. Pods without GPU, and the nodes' CPU and memory,
are left out, for every way alike. Ways:

- ``static``: every card split once by NVIDIA's mig-parted ``all-balanced`` (A100 40 GB: 2 x
  1g.5gb, 1 x 2g.10gb, 1 x 3g.20gb), served as NVIDIA's device plugin serves it (``mixed``
  strategy: a resource per profile). A pod asks for the smallest profile of that layout that holds
  its share (a 1g.10gb-sized pod asks for a 2g.10gb) and takes a free instance on the first node
  in tie-break order that has one; a pod larger than a 3g.20gb fits nowhere.
- ``first-fit``: cards in MIG mode with no instances; each instance made on demand on the first
  card (in tie-break order) where its profile still fits, where NVML puts it when not told
  (``mig_layout.choose``), as tools that create instances at scheduling time do.
- ``gpuledger``: the same, with ``mig_place.MigChooser`` choosing card and placement, weighed by
  the trace's own mix of profiles.

Nothing departs, so no instance is destroyed; each instance made on demand is one reconfiguration.
``replay.replay`` over the same pods gives the same requests as memory shares.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuledger_core.ids import CardUuid
from gpuledger_core.mig import free_instances, smallest
from gpuledger_core.mig_layout import choose as nvml_choose
from gpuledger_core.mig_layout import place_all
from gpuledger_core.mig_place import CardView, MigChooser, MigWorkload
from gpuledger_core.mig_profiles import A100_40GB, GiProfile
from gpuledger_core.model import Card, CardMode, MigInstance, MigSlot, Request
from gpuledger_sim.replay import Config, prepare
from gpuledger_sim.trace import WHOLE, TraceNode, TracePod

WAYS = ("static", "first-fit", "gpuledger")
MODEL, MODEL_NAME, CARD_MIB = A100_40GB, "NVIDIA A100-SXM4-40GB", 40960
MIG_MIB = MODEL.whole.memory_mib  # what MIG leaves of the card: a share is of this
ALL_BALANCED = ("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb")  # mig-parted's all-balanced, A100 40 GB


def profile_of(pod: TracePod, offered: Sequence[GiProfile] = MODEL.profiles) -> GiProfile | None:
    """The smallest profile among ``offered`` that holds the pod's share of one card."""
    mem = -(-pod.gpu_milli * MIG_MIB // WHOLE)
    found = smallest(MODEL, mem, pod.gpu_milli)
    if found is None or found in offered:
        return found
    fits = [p for p in offered if p.memory_mib >= mem and p.slices * WHOLE >= pod.gpu_milli * MODEL.whole.slices]
    return min(fits, key=lambda p: (p.memory_slices, p.slices), default=None)


@dataclass(slots=True)
class MigSummary:
    way: str
    seed: int
    cards: int
    pods: int = 0
    served: int = 0
    served_pct_at_100: float | None = None
    unused_slices_pct_at_100: float | None = None
    unallocated_gpu_pct_at_100: float | None = None
    instances_made: int = 0  # reconfigurations: instances created on demand
    instances_made_at_100: int | None = None
    static_instances: int = 0
    runtime_s: float = 0.0
    profiles: dict[str, int] = field(default_factory=dict)  # requests per profile asked


@dataclass(slots=True)
class Cards:
    """Every card of the cluster, grouped by state so that the choice looks at each state once."""

    cards: list[Card]
    node_of: list[int]  # each card's node, by position in tie-break order
    held: list[list[MigSlot]]
    groups: dict[object, list[int]] = field(default_factory=dict)  # state -> card positions, ascending

    def __post_init__(self) -> None:
        for at in range(len(self.cards)):
            self.groups.setdefault(self._key(at), []).append(at)

    def _key(self, at: int) -> object:
        return CardView(self.cards[at], tuple(self.held[at])).key()

    def take(self, at: int, slot: MigSlot) -> None:
        group = self.groups[self._key(at)]
        group.remove(at)
        if not group:
            del self.groups[self._key(at)]
        self.held[at].append(slot)
        self.groups.setdefault(self._key(at), []).append(at)
        self.groups[self._key(at)].sort()

    def free_slices(self) -> int:
        taken = sum(s.size for h in self.held for s in h)
        return len(self.cards) * MODEL.memory_slices - taken


def build(nodes: Sequence[TraceNode], way: str) -> Cards:
    cards: list[Card] = []
    node_of: list[int] = []
    starts = place_all(MODEL, [p for n in ALL_BALANCED if (p := MODEL.by_name(n)) is not None])
    for at, node in enumerate(nodes):
        for i in range(node.gpus):
            instances: tuple[MigInstance, ...] = ()
            if way == "static":
                instances = tuple(
                    MigInstance(MigSlot(name, s, p.memory_slices))
                    for name, s in zip(ALL_BALANCED, starts, strict=True)
                    if (p := MODEL.by_name(name)) is not None
                )
            cards.append(
                Card(CardUuid(f"{node.name}/{i}"), i, MODEL_NAME, CARD_MIB, mode=CardMode.MIG, instances=instances)
            )
            node_of.append(at)
    return Cards(cards, node_of, [[] for _ in cards])


def _first_fit(cards: Cards, profile: GiProfile) -> tuple[int, MigSlot] | None:
    found: tuple[int, MigSlot] | None = None
    for group in cards.groups.values():
        at = group[0]
        if found is not None and at > found[0]:
            continue
        taken = [(MODEL.by_name(s.profile), s.start) for s in cards.held[at]]
        start = nvml_choose(MODEL, profile, taken)  # type: ignore[arg-type]
        if start is not None:
            found = (at, MigSlot(profile.name, start, profile.memory_slices))
    return found


def _free_instance(cards: Cards, profile: GiProfile) -> tuple[int, MigSlot] | None:
    """The first card in tie-break order with a free instance of ``profile``, and that instance."""
    found: tuple[int, MigSlot] | None = None
    for group in cards.groups.values():
        at = group[0]
        if found is not None and at > found[0]:
            continue
        free = free_instances(cards.cards[at], cards.held[at], profile.name)
        if free:
            found = (at, free[0])
    return found


def _chosen(cards: Cards, chooser: MigChooser, request: Request) -> tuple[int, MigSlot] | None:
    best: tuple[tuple[float, bool, int], int, MigSlot] | None = None
    for group in cards.groups.values():
        at = group[0]
        option = chooser.best(CardView(cards.cards[at], tuple(cards.held[at])), request)
        if option is None:
            continue
        rank = option.rank()[:3]
        if best is None or (rank, at) < (best[0], best[1]):
            best = (rank, at, option.slot)
    return None if best is None else (best[1], best[2])


def _one(cards: Cards, way: str, chooser: MigChooser, pod: TracePod) -> tuple[int, MigSlot] | None:
    if way == "static":
        offered = [p for n in set(ALL_BALANCED) if (p := MODEL.by_name(n)) is not None]
        profile = profile_of(pod, offered)
        return None if profile is None else _free_instance(cards, profile)
    profile = profile_of(pod)
    if profile is None:
        return None
    if way == "first-fit":
        return _first_fit(cards, profile)
    return _chosen(cards, chooser, Request(mig=profile.name))


def _place(cards: Cards, way: str, chooser: MigChooser, pod: TracePod) -> list[tuple[int, MigSlot]] | None:
    """The pod's instances, one per card, all on one node; None when it fits nowhere."""
    if pod.num_gpu == 1:
        found = _one(cards, way, chooser, pod)
        return None if found is None else [found]
    # several whole cards: a 7g.40gb on each of num_gpu idle cards of one node (static: none)
    if way == "static":
        return None
    whole = MODEL.whole
    by_node: dict[int, list[int]] = {}
    for at, card in enumerate(cards.cards):
        if not cards.held[at] and not card.instances:
            by_node.setdefault(cards.node_of[at], []).append(at)
    for node in sorted(by_node):
        idle = by_node[node]
        if len(idle) >= pod.num_gpu:
            return [(at, MigSlot(whole.name, 0, whole.memory_slices)) for at in idle[: pod.num_gpu]]
    return None


def replay_mig(
    nodes: Sequence[TraceNode], pods: Sequence[TracePod], way: str, seed: int = 42, tune: float = 1.3
) -> MigSummary:
    started = time.perf_counter()
    setting = prepare(nodes, [p for p in pods if p.num_gpu], Config(seed=seed, tune=tune))
    cards = build(setting.nodes, way)
    asked = [p.name for pod in pods if pod.num_gpu and (p := profile_of(pod)) is not None]
    chooser = MigChooser(MigWorkload.of(asked), on_demand=way != "static")
    summary = MigSummary(way, seed, len(cards.cards), static_instances=sum(len(c.instances) for c in cards.cards))
    arrived = allocated = 0
    for pod in setting.order:
        found = _place(cards, way, chooser, pod)
        summary.pods += 1
        arrived += pod.gpu_total
        if found is not None:
            summary.served += 1
            allocated += pod.gpu_total
            for at, slot in found:
                summary.instances_made += not any(i.slot == slot for i in cards.cards[at].instances)
                cards.take(at, slot)
            summary.profiles[found[0][1].profile] = summary.profiles.get(found[0][1].profile, 0) + 1
        if summary.served_pct_at_100 is None and arrived >= setting.capacity:
            summary.served_pct_at_100 = round(100 * summary.served / summary.pods, 3)
            summary.unused_slices_pct_at_100 = round(100 * cards.free_slices() / (len(cards.cards) * 8), 3)
            summary.unallocated_gpu_pct_at_100 = round(100 - 100 * allocated / setting.capacity, 3)
            summary.instances_made_at_100 = summary.instances_made
    summary.runtime_s = round(time.perf_counter() - started, 2)
    return summary
