"""Mode C's choice of node for a claim at fleet scale: scoring every node for every claim (as mode C
did) beside the ranking placement keeps for classic pods of the claim's shape (``preferred``:
``PlacementService.best_nodes``), and the classic ``place`` of the same ask as a pod for
reference. A fleet of N nodes of 8 x 80 GiB cards with random holders in the view; a burst of
claims asks 10 GiB shares and whole cards in turn, each placed claim written to its node's
ledger and the view (so the ranking is kept current as mode C's writes change nodes). Prints
milliseconds per claim (median of rounds) and the ratio to scoring every node; checks that
both ways pick the same node and cards.

    PYTHONPATH=libs:services python -m benchmarks.claim_placement_scale [--nodes 1000,5000] [--claims 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from gpuledger_core.claim_asks import ClaimAsk, RequestAsk
from gpuledger_core.claim_placement import Preferred, claim_as_pod, place_claim
from gpuledger_core.claims import ClaimRef
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, AllocState, Card, CardShare, Grant, Node, Owner, OwnerKind, Request
from gpuledger_placement.app import Parts, build
from gpuledger_placement.kube import NoPodApi
from gpuledger_placement.settings import PlacementSettings

MIB = 81920
ASKS = (Request(1, 10240, 250), Request(1))


def fleet(nodes: int, seed: int) -> Parts:
    rng = random.Random(seed)
    parts = build(PlacementSettings(kube="off", stale_after_s=0.0), None, NoPodApi(), None, None)
    for n in range(nodes):
        name = NodeName(f"node-{n:05}")
        cards = tuple(
            Card(CardUuid(f"GPU-{n}-{i}"), i, "NVIDIA H100 80GB HBM3", MIB, numa=0, minor=i) for i in range(8)
        )
        ledger = NodeLedger(Node(name, cards))
        for card in cards:
            used = rng.choice([0, 0, 20480, 40960, 61440, MIB])
            if used:
                owner = Owner(OwnerKind.POD, f"uid-{n}-{card.index}", "ns", "p")
                share = CardShare(card.uuid, card.index, used, 1000 if used == MIB else 250, exclusive=used == MIB)
                allocation = Allocation(AllocationId(f"a-{n}-{card.index}"), owner, name, (Grant("main", (share,)),),
                                        AllocState.BOUND)  # fmt: skip
                ledger = reserve(ledger, allocation)
        parts.view.apply(name, ledger, 1)
    return parts


def burst(parts: Parts, claims: int, preferred: Preferred | None) -> tuple[float, list[tuple[str, tuple[Grant, ...]]]]:
    """Seconds per claim, and where each went; every placed claim written to the view."""
    view, revision, chosen, spent = parts.view, 2, [], 0.0
    policy = parts.service.current_policy()
    for i in range(claims):
        ask = ClaimAsk(ClaimRef("ns", f"c{i}", f"uid-c{i}"), (RequestAsk("gpu", (("gpu", ASKS[i % 2]),)),))
        ledgers = [entry.ledger for _, entry in sorted(view.entries.items())]
        started = time.perf_counter()
        plan = place_claim(ledgers, ask, policy, AllocationId(f"c-{i}"), 0.0, slots_per_card=8,
                           state=lambda ledger: view.entries[ledger.node.name].state, preferred=preferred)  # fmt: skip
        spent += time.perf_counter() - started
        node = plan.allocation.node
        view.apply(node, reserve(view.entries[node].ledger, plan.allocation), revision)
        revision += 1
        chosen.append((str(node), plan.allocation.grants))
    return spent / claims, chosen


def classic(parts: Parts, claims: int) -> float:
    """Seconds per ``PlacementService.place`` of the same asks as pods (nothing written)."""
    started = time.perf_counter()
    for i in range(claims):
        ask = ClaimAsk(ClaimRef("ns", f"p{i}", f"uid-p{i}"), (RequestAsk("gpu", (("gpu", ASKS[i % 2]),)),))
        parts.service.place(claim_as_pod(ask))
    return (time.perf_counter() - started) / claims


def median_ms(runs: list[float]) -> float:
    return statistics.median(runs) * 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.claims < 1 or args.rounds < 1:
        parser.error("--claims and --rounds must be at least 1")
    print("| nodes | every node scored (ms/claim) | from the ranking (ms/claim) | ratio | classic place (ms/pod) |")
    print("|---:|---:|---:|---:|---:|")
    for nodes in (int(n) for n in args.nodes.split(",")):
        scored: list[float] = []
        ranked: list[float] = []
        places: list[float] = []
        for r in range(args.rounds):
            every, first = burst(fleet(nodes, r), args.claims, None)
            parts = fleet(nodes, r)
            best: Callable[..., list[str]] = parts.service.best_nodes
            fast, second = burst(parts, args.claims, best)
            if first != second:
                raise SystemExit(f"{nodes} nodes, round {r}: the two ways chose differently")
            scored.append(every)
            ranked.append(fast)
            places.append(classic(fleet(nodes, r), args.claims))
        a, b, c = median_ms(scored), median_ms(ranked), median_ms(places)
        print(f"| {nodes} | {a:.1f} | {b:.2f} | {b / a:.3f} | {c:.2f} |")


if __name__ == "__main__":
    main()
