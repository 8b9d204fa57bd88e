"""Per-card metrics, read from the replica's view at scrape time (no stale series)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from gpuledger_allocator.queries import cluster
from gpuledger_allocator.view import ClusterView

LABELS = ["node", "card", "uuid", "model"]


class CardCollector(Collector):
    """Reads the first registered view (a process normally runs one allocator; tests run several)."""

    def __init__(self) -> None:
        self.views: list[ClusterView] = []

    def collect(self) -> Iterator[Metric]:
        if not self.views:
            return
        view = self.views[0]
        families = {
            "memory_total": GaugeMetricFamily(
                "gpuledger_card_memory_mib", "Card memory as NVML reports it", labels=LABELS
            ),
            "memory_free": GaugeMetricFamily(
                "gpuledger_card_memory_free_mib", "Card memory not held by anyone", labels=LABELS
            ),
            "core_free": GaugeMetricFamily(
                "gpuledger_card_core_free_permille", "Card compute not held, per mille", labels=LABELS
            ),
            "holders": GaugeMetricFamily(
                "gpuledger_card_holders", "Allocations holding a share of the card", labels=LABELS
            ),
            "healthy": GaugeMetricFamily("gpuledger_card_healthy", "1 if the card is healthy", labels=LABELS),
            "foreign": GaugeMetricFamily(
                "gpuledger_card_foreign_memory_mib",
                "Memory used on the card that the ledger did not grant",
                labels=LABELS,
            ),
            "foreign_processes": GaugeMetricFamily(
                "gpuledger_card_foreign_processes",
                "Processes on the card the ledger does not account for",
                labels=LABELS,
            ),
        }
        stale = GaugeMetricFamily("gpuledger_node_stale", "1 if the node's heartbeat stopped", labels=["node"])
        for node in cluster(view):
            stale.add_metric([node.name], 1.0 if node.stale else 0.0)
            for c in node.cards:
                labels = [node.name, str(c.card.index), c.card.uuid, c.card.model]
                families["memory_total"].add_metric(labels, c.card.memory_mib)
                families["memory_free"].add_metric(labels, c.free_mem_mib)
                families["core_free"].add_metric(labels, c.free_core_milli)
                families["holders"].add_metric(labels, len(c.holders))
                families["healthy"].add_metric(labels, 1.0 if c.card.healthy else 0.0)
                families["foreign"].add_metric(labels, c.foreign_mib)
                families["foreign_processes"].add_metric(labels, c.foreign_processes)
        yield from families.values()
        yield stale


_COLLECTOR = CardCollector()


def register(view: ClusterView) -> CardCollector:
    if not _COLLECTOR.views:
        REGISTRY.register(_COLLECTOR)
    _COLLECTOR.views.append(view)
    return _COLLECTOR


def unregister(view: ClusterView) -> None:
    _COLLECTOR.views.remove(view)
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
    "gpuledger_allocator_reconcile_list_failures_total", "Pod listings that failed (nothing was reconciled)"
)
