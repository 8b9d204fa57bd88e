"""The allocator's ledger gauges: per model and per node, never per card, and current with the view."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import Metric

from gpuledger_allocator.metrics import LedgerMetrics
from gpuledger_allocator.queries import cluster
from gpuledger_allocator.view import ClusterView
from gpuledger_common.fleet import parse_fleet
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Grant
from tests.unit.core.builders import allocation, whole

NODES = 6


class _Store:
    def remember(self, *_: Any) -> None:
        pass


def samples(families: list[Metric]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, tuple(s.labels.values())): s.value for f in families for s in f.samples}


def test_series_grow_with_nodes_not_cards_and_follow_the_ledger() -> None:
    text = "nodes:\n" + "".join(
        f"  - name: n{i}\n    profile: {'h100-sxm-8' if i % 2 else 'a100-pcie-4'}\n" for i in range(NODES)
    )
    fleet = parse_fleet(text)
    view = ClusterView(_Store(), stale_after_s=3600.0)  # type: ignore[arg-type]
    for revision, node in enumerate(fleet.nodes, start=1):
        view.apply(NodeName(node.node.name), NodeLedger(node.node), revision)
    gauges = LedgerMetrics(view)
    found = samples(gauges.families())
    cards = sum(len(n.node.cards) for n in fleet.nodes)
    assert len(found) < cards  # 36 cards: seven gauges per card would be 252 series
    by_model = {labels[0]: v for (name, labels), v in found.items() if name == "gpuledger_model_cards"}
    h100 = next(n.node for n in fleet.nodes if n.node.name == "n1").cards[0].model
    assert by_model[h100] == 8 * (NODES // 2)
    assert sum(by_model.values()) == cards
    assert found[("gpuledger_model_cards_idle", (h100,))] == 8 * (NODES // 2)
    assert {labels for (name, labels) in found if name == "gpuledger_node_stale"} == {(f"n{i}",) for i in range(NODES)}

    n1 = view.ledgers[NodeName("n1")]
    card = n1.node.cards[0]
    held = allocation("a", Grant("", (whole(card),)), name=NodeName("n1"))
    view.apply(NodeName("n1"), reserve(n1, held), 100)
    after = samples(gauges.families())
    assert after[("gpuledger_model_cards_idle", (h100,))] == 8 * (NODES // 2) - 1
    assert after[("gpuledger_model_holders", (h100,))] == 1
    assert (
        after[("gpuledger_model_memory_free_mib", (h100,))]
        == found[("gpuledger_model_memory_free_mib", (h100,))] - card.memory_mib
    )
    # What a listing shows is what the gauges add up.
    listed = [c for node in cluster(view) for c in node.cards if c.card.model == h100]
    assert sum(c.free_mem_mib for c in listed) == after[("gpuledger_model_memory_free_mib", (h100,))]
