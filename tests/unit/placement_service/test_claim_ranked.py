"""Mode C places a claim from the ranking classic pods of its shape are placed by
(``PlacementService.best_nodes`` as ``place_claim``'s ``preferred``), not by scoring every node for
every claim: the same node and cards as scoring every node, on random fleets; and the caller's
nodes are honoured in their order, with every node scored only where none of them takes it."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from gpuledger_core.claim_asks import ClaimAsk, RequestAsk
from gpuledger_core.claim_placement import Preferred, claim_as_pod, place_claim
from gpuledger_core.claims import ClaimRef
from gpuledger_core.errors import Exhausted
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Request
from gpuledger_core.nvlink import Linked
from gpuledger_core.packing import make_policy
from gpuledger_core.pods import PodAsk
from gpuledger_dev.fleet import parse_fleet
from gpuledger_placement.app import build
from gpuledger_placement.kube import NoPodApi
from gpuledger_placement.settings import PlacementSettings
from tests.unit.core.test_claim_placement import held

REF = ClaimRef("ns", "c", "uid-c")
ID = AllocationId("c-planned")
FLEET = "nodes:\n" + "".join(
    f"  - name: {name}\n    profile: {profile}\n"
    for name, profile in [("a-h100", "h100-sxm-8"), ("b-p4", "tesla-p4-2"), ("c-a100", "a100-pcie-4"),
                          ("d-h100", "h100-sxm-8"), ("e-rtx", "rtx3090-1"), ("f-dgx", "dgx1-v100")]
)  # fmt: skip
ASKS = [
    Request(1, 4096, 100), Request(1, 10240, 250), Request(1), Request(2), Request(4), Request(2, 8192, 200),
]  # fmt: skip


def _ask(request: Request, linked: bool = False) -> ClaimAsk:
    constraint = (Linked(2, ("gpu",)),) if linked and request.count == 2 else ()
    return ClaimAsk(REF, (RequestAsk("gpu", (("gpu", request),)),), linked=constraint)


@pytest.mark.parametrize("policy", ["default", "binpack", "spread"])
def test_the_ranking_chooses_what_scoring_every_node_chooses(policy: str) -> None:
    rng = random.Random(7)
    for case in range(12):
        parts = build(PlacementSettings(kube="off", stale_after_s=0.0, policy=policy), None, NoPodApi(), None, None)
        ledgers = []
        for revision, node in enumerate(sorted(parse_fleet(FLEET).nodes, key=lambda n: n.node.name), start=1):
            ledger = NodeLedger(node.node)
            for card in node.node.cards:
                used = rng.choice([0, 0, 0, card.memory_mib // 4, card.memory_mib // 2, card.memory_mib])
                if used:
                    ledger = held(ledger, card.index, used, f"h{case}")
            parts.view.apply(NodeName(node.node.name), ledger, revision)
            ledgers.append(ledger)
        service, made = parts.service, make_policy(policy)
        for request in ASKS:
            for linked in (False, True):
                ask = _ask(request, linked)
                try:
                    scored = place_claim(ledgers, ask, made, ID, 0.0, slots_per_card=8).allocation
                except Exhausted:
                    with pytest.raises(Exhausted):
                        place_claim(ledgers, ask, made, ID, 0.0, slots_per_card=8, preferred=service.best_nodes)
                    continue
                ranked = place_claim(ledgers, ask, made, ID, 0.0, slots_per_card=8, preferred=service.best_nodes)
                assert (ranked.allocation.node, ranked.allocation.grants) == (scored.node, scored.grants), (
                    case, request, linked)  # fmt: skip


def test_the_callers_nodes_are_planned_in_their_order_and_every_node_only_where_none_takes_it() -> None:
    parts = build(PlacementSettings(kube="off", stale_after_s=0.0), None, NoPodApi(), None, None)
    ledgers = [NodeLedger(n.node) for n in parse_fleet(FLEET).nodes]
    for revision, ledger in enumerate(ledgers, start=1):
        parts.view.apply(ledger.node.name, ledger, revision)
    asked: list[list[str]] = []

    def preferred(names: list[str]) -> Preferred:
        def answer(pod: PodAsk, skip: Callable[[str], bool]) -> list[str]:
            asked.append(names)
            return names

        return answer

    whole = _ask(Request(1))
    found = place_claim(ledgers, whole, make_policy("default"), ID, 0.0, slots_per_card=8,
                        preferred=preferred(["e-rtx", "a-h100"]))  # fmt: skip
    assert found.allocation.node == "e-rtx" and asked == [["e-rtx", "a-h100"]]
    eight = _ask(Request(8))  # only the 8-card nodes take it: the caller's two do not, every node is scored
    found = place_claim(ledgers, eight, make_policy("default"), ID, 0.0, slots_per_card=8,
                        preferred=preferred(["e-rtx", "b-p4"]))  # fmt: skip
    assert found.allocation.node in ("a-h100", "d-h100", "f-dgx")
    assert parts.service.best_nodes(claim_as_pod(whole), lambda n: n != "b-p4") == ["b-p4"]
