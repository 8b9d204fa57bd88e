"""The allocator's ledger gauges: per model and per node, never per card, and current with the view."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import Metric

from gpuledger_allocator.metrics import LedgerMetrics
from gpuledger_allocator.queries import cluster
from gpuledger_allocator.view import ClusterView
from gpuledger_core.card_usage import ProcessUse, Usage
from gpuledger_core.ids import NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import CardShare, Grant
from gpuledger_dev.fleet import parse_fleet
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
    assert found[("gpuledger_nodes", ())] == NODES
    assert found[("gpuledger_nodes_stale", ())] == 0
    assert not [labels for (name, labels) in found if name == "gpuledger_node_stale"]  # only stale nodes have one

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


def test_per_node_series_only_where_something_is_wrong_and_totals_follow_every_change() -> None:
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: n{i}\n    profile: h100-sxm-8\n" for i in range(NODES)))
    now = [1000.0]
    view = ClusterView(_Store(), stale_after_s=30.0, clock=lambda: now[0])  # type: ignore[arg-type]
    view.started_at = now[0]
    for revision, node in enumerate(fleet.nodes, start=1):
        view.apply(NodeName(node.node.name), NodeLedger(node.node), revision)
        view.heartbeat(NodeName(node.node.name), now[0])
    gauges = LedgerMetrics(view)
    model = fleet.nodes[0].node.cards[0].model
    assert samples(gauges.families())[("gpuledger_model_cards", (model,))] == 8 * NODES

    now[0] += 31.0
    for node in fleet.nodes[1:]:
        view.heartbeat(NodeName(node.node.name), now[0])
    view.usage[NodeName("n2")] = {fleet.nodes[2].node.cards[0].uuid: Usage(processes=2, used_mib=500)}
    view.apply(NodeName("n3"), None, 50)
    found = samples(gauges.families())
    assert found[("gpuledger_nodes", ())] == NODES - 1
    assert found[("gpuledger_nodes_stale", ())] == 1
    assert [labels for (name, labels) in found if name == "gpuledger_node_stale"] == [("n0",)]
    assert [labels for (name, labels) in found if name == "gpuledger_node_foreign_processes"] == [("n2",)]
    assert found[("gpuledger_model_cards", (model,))] == 8 * (NODES - 1)
    assert found[("gpuledger_model_foreign_processes", (model,))] == 2

    for node in fleet.nodes:
        view.apply(NodeName(node.node.name), None, 100)
    found = samples(gauges.families())
    assert found[("gpuledger_nodes", ())] == 0
    assert not [labels for (name, labels) in found if name == "gpuledger_model_cards"]  # no series of a gone model


async def test_warming_counts_every_node_ahead_of_the_first_scrape() -> None:
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: n{i}\n    profile: h100-sxm-8\n" for i in range(NODES)))
    view = ClusterView(_Store(), stale_after_s=3600.0)  # type: ignore[arg-type]
    for revision, node in enumerate(fleet.nodes, start=1):
        view.apply(NodeName(node.node.name), NodeLedger(node.node), revision)
    gauges = LedgerMetrics(view)
    await gauges.warm(per_turn=2)
    assert set(gauges._counted) == {node.node.name for node in fleet.nodes}
    assert samples(gauges.families())[("gpuledger_nodes", ())] == NODES


def test_holders_over_their_grants_have_series_only_while_over() -> None:
    fleet = parse_fleet("nodes:\n" + "".join(f"  - name: n{i}\n    profile: h100-sxm-8\n" for i in range(NODES)))
    view = ClusterView(_Store(), stale_after_s=3600.0)  # type: ignore[arg-type]
    for revision, node in enumerate(fleet.nodes, start=1):
        view.apply(NodeName(node.node.name), NodeLedger(node.node), revision)
    n1 = view.ledgers[NodeName("n1")]
    card = n1.node.cards[0]
    held = allocation("a", Grant("main", (CardShare(card.uuid, card.index, 4000, 250),)), name=NodeName("n1"))
    view.apply(NodeName("n1"), reserve(n1, held), 100)
    gauges = LedgerMetrics(view)

    def over(used: int) -> dict[tuple[str, tuple[str, ...]], float]:
        view.usage[NodeName("n1")] = {card.uuid: Usage(1, used, (ProcessUse(used, "uid-a", "c1"),))}
        found = samples(gauges.families())
        return {k: v for k, v in found.items() if "over_grant" in k[0]}

    assert over(3000) == {}  # within: no series at all, on no node
    assert over(4500) == {
        ("gpuledger_node_holders_over_grant", ("n1",)): 1,
        ("gpuledger_holder_over_grant_mib", ("n1", card.uuid, "default", "pod-a", "main", "memory")): 500,
    }
    assert over(3999) == {}  # back within: the series go
