"""The ledger's metrics, read from the replica's view at scrape time (no stale series).

Per model and per node, not per card: seven gauges per card made 285,000 series and a 39 MB
scrape at 5,000 nodes of 8 cards, which took 2.5 s on the allocator's event loop. Per card detail
is in ``gpuledger inspect`` and the dashboard. Per node only where something is wrong (a stale
heartbeat, unhealthy cards, foreign processes, holders over their grants; per holder only while
it is over): a gauge of every node, 5,000 series of zeros, was
most of a scrape's time on the event loop. The per-model sums are kept as nodes change: a scrape
works over the nodes whose key or usage changed since the last one, not over every node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from gpuledger_allocator.view import ClusterView
from gpuledger_core.card_usage import Usage
from gpuledger_core.ids import NodeName
from gpuledger_core.status import NodeStatus

MODEL_GAUGES = {  # per model (label ``model``): sums over the model's cards
    "cards": ("gpuledger_model_cards", "Cards of the model in the ledger"),
    "unhealthy": ("gpuledger_model_cards_unhealthy", "Cards of the model that are not healthy"),
    "idle": ("gpuledger_model_cards_idle", "Healthy cards of the model that nobody holds a share of"),
    "memory": ("gpuledger_model_memory_mib", "Card memory of the model's cards, as NVML reports it"),
    "memory_free": ("gpuledger_model_memory_free_mib", "Memory of the model's cards not held by anyone"),
    "core_free": ("gpuledger_model_core_free_permille", "Compute of the model's cards not held, per mille summed"),
    "holders": ("gpuledger_model_holders", "Shares held on the model's cards (an allocation per card it holds)"),
    "foreign_memory": (
        "gpuledger_model_foreign_memory_mib",
        "Memory used on the model's cards that the ledger did not grant",
    ),
    "foreign_processes": (
        "gpuledger_model_foreign_processes",
        "Processes on the model's cards that the ledger does not account for",
    ),
}
NODE_GAUGES = {  # per node (label ``node``), only for the nodes where they are not 0
    "stale": ("gpuledger_node_stale", "1 if the node's heartbeat stopped (stale nodes only)"),
    "unhealthy": ("gpuledger_node_cards_unhealthy", "Cards of the node that are not healthy (nodes with some)"),
    "foreign_processes": (
        "gpuledger_node_foreign_processes",
        "Processes on the node's cards that the ledger does not account for (nodes with some)",
    ),
    "over": (
        "gpuledger_node_holders_over_grant",
        "Holders using more memory of a card than granted, per node (nodes with some; docs/audit.md)",
    ),
}
HOLDER_GAUGE = (  # per holder and card, only while it is over
    "gpuledger_holder_over_grant_mib",
    "Memory a holder's processes use on a card beyond its grant (holders over only; docs/audit.md)",
)
HOLDER_LABELS = ["node", "uuid", "holder_namespace", "holder_pod", "holder_container", "resource"]
NODES_GAUGE = ("gpuledger_nodes", "Nodes in the ledger")
STALE_GAUGE = ("gpuledger_nodes_stale", "Nodes in the ledger whose heartbeat stopped")
WARM_PER_TURN = 100


@dataclass(slots=True)
class _Sums:
    cards: int = 0
    unhealthy: int = 0
    idle: int = 0
    memory: int = 0
    memory_free: int = 0
    core_free: int = 0
    holders: int = 0
    foreign_memory: int = 0
    foreign_processes: int = 0

    def add(self, other: _Sums, sign: int = 1) -> None:
        for key in MODEL_GAUGES:
            setattr(self, key, getattr(self, key) + sign * getattr(other, key))


def _sums_of(status: NodeStatus) -> dict[str, _Sums]:
    """The node's cards added up per model."""
    found: dict[str, _Sums] = {}
    for c in status.cards:
        sums = found.setdefault(c.card.model, _Sums())
        sums.cards += 1
        sums.unhealthy += not c.card.healthy
        sums.idle += c.card.healthy and not c.holders
        sums.memory += c.card.memory_mib
        sums.memory_free += c.free_mem_mib
        sums.core_free += c.free_core_milli
        sums.holders += len(c.holders)
        sums.foreign_memory += c.foreign_mib
        sums.foreign_processes += c.foreign_processes
    return found


@dataclass(frozen=True, slots=True)
class _Counted:
    """What a node added to the totals, and from which revision of its key and usage report."""

    revision: int
    usage: dict[str, Usage] | None
    sums: dict[str, _Sums]
    unhealthy: int
    foreign: int
    over: tuple[tuple[list[str], int], ...] = ()  # per holder over its grant: its labels, MiB beyond


def _over_of(status: NodeStatus) -> tuple[tuple[list[str], int], ...]:
    """The node's holders over their grants: the gauge's labels and the MiB beyond the grant."""
    return tuple(
        ([status.name, c.card.uuid, h.owner.namespace, h.owner.name, h.container, "memory"],
         (h.used_mib or 0) - h.mem_mib)
        for c in status.cards for h in c.holders if h.over
    )  # fmt: skip


@dataclass(slots=True)
class LedgerMetrics:
    """The per-model and per-node gauges of a view. The per-model totals are kept: a node's part
    in them is taken out and counted again when its key or its usage report changed."""

    view: ClusterView
    _counted: dict[NodeName, _Counted] = field(default_factory=dict)
    _totals: dict[str, _Sums] = field(default_factory=dict)

    def families(self) -> list[Metric]:
        view = self.view
        for name, revision in view.revisions.items():
            known = self._counted.get(name)
            if known is None or known.revision != revision or known.usage is not view.usage.get(name):
                self._count(name, known)
        for gone in self._counted.keys() - view.revisions.keys():
            self._forget(self._counted.pop(gone))
        nodes = {key: GaugeMetricFamily(name, text, labels=["node"]) for key, (name, text) in NODE_GAUGES.items()}
        holders = GaugeMetricFamily(*HOLDER_GAUGE, labels=HOLDER_LABELS)
        for name, known in self._counted.items():
            if known.unhealthy:
                nodes["unhealthy"].add_metric([name], known.unhealthy)
            if known.foreign:
                nodes["foreign_processes"].add_metric([name], known.foreign)
            if known.over:
                nodes["over"].add_metric([name], len(known.over))
            for labels, beyond in known.over:
                holders.add_metric(labels, beyond)
        stale = view.stale_nodes()
        for name in stale:
            nodes["stale"].add_metric([name], 1.0)
        found: list[Metric] = [
            GaugeMetricFamily(*NODES_GAUGE, value=len(self._counted)),
            GaugeMetricFamily(*STALE_GAUGE, value=len(stale)),
        ]
        for key, (metric, text) in MODEL_GAUGES.items():
            family = GaugeMetricFamily(metric, text, labels=["model"])
            for model, sums in sorted(self._totals.items()):
                if sums.cards:
                    family.add_metric([model], getattr(sums, key))
            found.append(family)
        return [*found, *nodes.values(), holders]

    async def warm(self, per_turn: int = WARM_PER_TURN) -> None:
        """Count every node before the first scrape, ``per_turn`` nodes per turn of the event loop
        (a node's first count makes its status: 5,000 of them at once stopped the loop for 0.2 s)."""
        for done, name in enumerate(list(self.view.revisions), start=1):
            known = self._counted.get(name)
            if known is None or known.revision != self.view.revisions.get(name):
                self._count(name, known)
            if done % per_turn == 0:
                await asyncio.sleep(0)

    def _count(self, name: NodeName, known: _Counted | None) -> None:
        if known is not None:
            self._forget(known)
        status = self.view.status(name)
        if status is None:
            self._counted.pop(name, None)
            return
        sums = _sums_of(status)
        for model, part in sums.items():
            self._totals.setdefault(model, _Sums()).add(part)
        unhealthy = sum(part.unhealthy for part in sums.values())
        foreign = sum(part.foreign_processes for part in sums.values())
        revision, usage = self.view.revisions.get(name, 0), self.view.usage.get(name)
        self._counted[name] = _Counted(revision, usage, sums, unhealthy, foreign, _over_of(status))

    def _forget(self, known: _Counted) -> None:
        for model, part in known.sums.items():
            self._totals[model].add(part, -1)


class CardCollector(Collector):
    """Reads the first registered view (a process normally runs one allocator; tests run several)."""

    def __init__(self) -> None:
        self.views: list[LedgerMetrics] = []

    def collect(self) -> Iterator[Metric]:
        if self.views:
            yield from self.views[0].families()


_COLLECTOR = CardCollector()


def register(view: ClusterView) -> LedgerMetrics:
    if not _COLLECTOR.views:
        REGISTRY.register(_COLLECTOR)
    metrics = LedgerMetrics(view)
    _COLLECTOR.views.append(metrics)
    return metrics


def unregister(view: ClusterView) -> None:
    _COLLECTOR.views = [m for m in _COLLECTOR.views if m.view is not view]
    if not _COLLECTOR.views:
        REGISTRY.unregister(_COLLECTOR)


# --- reconciliation with Kubernetes (counters: registered once, at import) ---

RELEASED = Counter(
    "gpuledger_allocator_reconcile_released_total",
    "Allocations released because their pod was deleted or finished",
    ["reason"],
)
REBUILT = Counter(
    "gpuledger_allocator_reconcile_rebuilt_total", "Allocations rebuilt from a pod's gpuledger.io/allocation annotation"
)
REBUILD_CONFLICTS = Counter(
    "gpuledger_allocator_reconcile_conflicts_total",
    "Annotated allocations that could not be rebuilt (cards missing, no room, wrong owner), per round",
)
LIST_FAILURES = Counter(
    "gpuledger_allocator_reconcile_list_failures_total",
    "Pod listings or watches that failed (nothing is reconciled until a listing succeeds again)",
)
POD_LISTINGS = Counter("gpuledger_allocator_reconcile_listings_total", "Complete listings of the followed pods")
POD_EVENTS = Counter("gpuledger_allocator_reconcile_pod_events_total", "Pod watch events applied", ["type"])
ROUNDS = Counter(
    "gpuledger_allocator_reconcile_rounds_total", "Reconcile rounds that compared the ledger with the pods"
)
POD_READS = Counter(
    "gpuledger_allocator_reconcile_pod_reads_total",
    "Pods read one by one: the ledger holds cards for them and the watch does not show them",
)

# --- the placement service's answers ---

PLACEMENT_ANSWERS = Counter(
    "gpuledger_allocator_placement_answers_total",
    "Where a request's nodes came from: placement asked during it (asked), placement's answer asked "
    "ahead of it (ahead), or the built-in fit while placement does not answer (builtin)",
    ["source"],
)

# --- tools on a draining card (docs/remediation.md) ---

TOOL_DRAINS = Counter(
    "gpuledger_allocator_tool_drains_total",
    "Tool allocations on a card under repair: told (marked; the owner is told), released (at the end of "
    "the grace), cancelled (the card served again first); counted by the replica whose write did it",
    ["result"],
)
