"""Topology Manager ``single-numa-node`` on the real kubelet: a 2-card pod gets two cards of one
NUMA node (as the fleet declares them), each container sees exactly those.

This host has one NUMA node. kubelet ignores the NUMA IDs a device plugin reports that cadvisor
does not know ("Ignoring NUMA node IDs reported by device plugin that are unknown to cadvisor"),
and on one NUMA node every set of devices is "one NUMA node": kubelet admits both pods, and the
refusal of a set split across NUMA nodes can only be seen on a host with two (docs/e2e.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpuledger_core.model import Card
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.local_stack import Stack, running_stack
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.real_cluster import RealCluster
from tests.e2e.helpers import card_nodes, ledger, namespace, pod

pytestmark = pytest.mark.asyncio(loop_scope="session")

FLEET = Path(__file__).with_name("numa_fleet.yaml")
NODE = "numa-4"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def numa_stack() -> AsyncIterator[Stack]:
    fleet = load_fleet(FLEET)
    async with running_stack(
        fleet, free_port(), free_port(), _say, "real", real_node=NODE, topology_policy="single-numa-node"
    ) as stack:
        yield stack


def _say(message: str) -> None:
    print(f"[numa stack] {message}", flush=True)


@pytest.mark.timeout(300)
async def test_two_card_pods_get_two_cards_of_one_numa_node(numa_stack: Stack) -> None:
    cluster = numa_stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.api is not None and cluster.real is not None
    cards: dict[str, Card] = {c.uuid: c for c in (await ledger(numa_stack))[NODE].node.cards}
    async with namespace(cluster.api, "numa", numa_stack) as ns:
        seen: list[set[int]] = []
        for name in ("first", "second"):
            outcome = await cluster.run(pod(name, ns, {"gpuledger.io/gpu": "2"}, node=NODE))
            assert outcome.node == NODE, outcome
            got = [cards[u] for u in outcome.env["app"]["CUDA_VISIBLE_DEVICES"].split(",")]
            assert len({c.numa for c in got}) == 1, got  # one NUMA node
            assert card_nodes(outcome.dev["app"]) == sorted(f"nvidia{c.minor}" for c in got)
            seen.append({c.index for c in got})
        assert seen[0].isdisjoint(seen[1])
    log = (cluster.real.root / "logs" / "kubelet.log").read_text()
    assert "unknown to cadvisor" in log and "unknownNodes=[1] knownNodes=[0]" in log  # what this host shows
