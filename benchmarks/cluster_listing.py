"""A GetCluster page written and read by ``clusterwire`` next to betterproto (the peer), in one run;
and a ListAllocations answer written by both.

Each node of the page is an 8-card node (a100-sxm-8) with ``--holders`` bound one-card
allocations, about 1 KB on the wire. For each round it times, per node: betterproto's writing
(``node_status_to`` and ``bytes(Cluster)``) and reading (``Cluster().parse`` and
``node_status_from``), and clusterwire's writing with each node's cards new (as after a change),
writing with them unchanged (kept), and reading; and per allocation, a ListAllocations answer of
the page's allocations written by both. It prints medians over the rounds, and the ratios, and
checks that both write the same bytes.

    python -m benchmarks.cluster_listing [--nodes 100] [--rounds 15] [--holders 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

from gpuledger_common import clusterwire
from gpuledger_common import pbconvert as conv
from gpuledger_core.fit import ContainerAsk, fit_node
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, AllocState, CardShare, Grant, Owner, OwnerKind, Request
from gpuledger_core.status import NodeStatus, node_status
from gpuledger_dev.fleet import parse_fleet
from gpuledger_proto.gpuledger.allocator import v1 as pb


def statuses(count: int, holders: int) -> list[NodeStatus]:
    node = parse_fleet("nodes:\n  - name: n0\n    profile: a100-sxm-8\n").nodes[0].node
    ledger = NodeLedger(node)
    ask = (ContainerAsk("main", Request(count=1, mem_mib=4096)),)
    for i in range(holders):
        owner = Owner(OwnerKind.POD, f"uid-{i}", "default", f"trainer-{i}")
        grants = fit_node(ledger, ask, 16)
        ledger = reserve(
            ledger, Allocation(AllocationId(f"a{i}"), owner, node.name, grants, AllocState.BOUND, created_at=1e9)
        )
    one = node_status(ledger, revision=12)
    return [replace(one, name=NodeName(f"n{i:05d}")) for i in range(count)]


def allocations_of(page: list[NodeStatus]) -> list[Allocation]:
    """An allocation per holder on the page, as ListAllocations answers them."""
    found = []
    for status in page:
        for card in status.cards:
            for h in card.holders:
                share = CardShare(card.card.uuid, card.card.index, h.mem_mib, h.core_milli, h.exclusive)
                grant = Grant(h.container, (share,))
                found.append(
                    Allocation(
                        AllocationId(f"{status.name}-{h.allocation_id}"),
                        h.owner,
                        status.name,
                        (grant,),
                        h.state,
                        created_at=h.since,
                        updated_at=h.since,
                    )
                )
    return found


def per_node(work: Callable[[], object], nodes: int) -> float:
    t0 = time.perf_counter()
    work()
    return (time.perf_counter() - t0) / nodes * 1e6


def main(count: int, rounds: int, holders: int) -> None:
    page = statuses(count, holders)
    theirs = bytes(pb.Cluster(nodes=[conv.node_status_to(n) for n in page], next_page_token="next"))
    if clusterwire.cluster_bytes(page, "next") != theirs:
        raise SystemExit("clusterwire and betterproto wrote different bytes")
    listed = allocations_of(page)
    theirs_listed = bytes(pb.ListAllocationsResponse(allocations=[conv.allocation_to(a) for a in listed]))
    if clusterwire.allocations_bytes(listed) != theirs_listed:
        raise SystemExit("clusterwire and betterproto wrote different ListAllocations bytes")
    rows: dict[str, list[float]] = {}

    def fresh() -> list[NodeStatus]:  # new cards tuples: nothing kept
        return [replace(n, cards=(*n.cards,)) for n in page]

    for _ in range(rounds):
        rows.setdefault("betterproto: write", []).append(
            per_node(lambda: bytes(pb.Cluster(nodes=[conv.node_status_to(n) for n in page])), count)
        )
        rows.setdefault("betterproto: read", []).append(
            per_node(lambda: [conv.node_status_from(n) for n in pb.Cluster().parse(theirs).nodes], count)
        )
        changed = fresh()
        rows.setdefault("clusterwire: write, every node changed", []).append(
            per_node(lambda changed=changed: clusterwire.cluster_bytes(changed, "next"), count)  # type: ignore[misc]
        )
        rows.setdefault("clusterwire: write, nodes unchanged", []).append(
            per_node(lambda changed=changed: clusterwire.cluster_bytes(changed, "next"), count)  # type: ignore[misc]
        )
        rows.setdefault("clusterwire: read", []).append(per_node(lambda: clusterwire.cluster_from(theirs), count))
        rows.setdefault("betterproto: write ListAllocations, per allocation", []).append(
            per_node(
                lambda: bytes(pb.ListAllocationsResponse(allocations=[conv.allocation_to(a) for a in listed])),
                len(listed),
            )
        )
        rows.setdefault("clusterwire: write ListAllocations, per allocation", []).append(
            per_node(lambda: clusterwire.allocations_bytes(listed), len(listed))
        )
    median = {row: statistics.median(values) for row, values in rows.items()}
    print(
        f"cluster listing: a page of {count} nodes (8 cards, {holders} holders each, {len(theirs) / count:.0f} bytes"
        f" a node), {rounds} rounds; both write the same bytes\n"
    )
    print("| path | us per node (per allocation for ListAllocations), median | betterproto's over this |")
    print("|---|---|---|")
    for row, value in median.items():
        peer = median[
            "betterproto: write ListAllocations, per allocation"
            if "ListAllocations" in row
            else "betterproto: read"
            if row.endswith("read")
            else "betterproto: write"
        ]
        print(f"| {row} | {value:.1f} | {peer / value:.1f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--holders", type=int, default=4)
    args = parser.parse_args()
    main(args.nodes, args.rounds, args.holders)
