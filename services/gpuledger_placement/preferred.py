"""GetPreferredAllocation's ranking: the best-connected cards among the device IDs kubelet offers.

Pure: the service hands it the node's ledger and the policy that ranks card sets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.ids import CardUuid
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Request
from gpuledger_core.packing import Ask, Decision, NodeState, Policy, from_ledger, place
from gpuledger_core.slots import parse_device_id


def preferred_ids(
    ledger: NodeLedger, available: Collection[str], must_include: Collection[str], size: int, policy: Policy
) -> list[str]:
    """``size`` device IDs on distinct cards, the best-connected set of the offered ones, the
    lowest slot of each; ``FailedPrecondition`` when ``must_include`` is not already enough."""
    offered = _ids_by_card(available, must_include)
    fixed = {parse_device_id(i)[0] for i in must_include}
    if len(fixed) >= size:
        return sorted(must_include)[:size]
    if fixed:
        raise FailedPrecondition("a preference that must include given devices is ranked by the node itself")
    found = place([_offered_only(ledger, offered)], Ask(Request(size)), policy)
    if not isinstance(found, Decision):
        return []
    uuids = {card.index: card.uuid for card in ledger.node.cards}
    return [offered[uuids[index]][0] for index in found.cards]


def _ids_by_card(available: Collection[str], must_include: Collection[str]) -> dict[CardUuid, list[str]]:
    found: dict[CardUuid, list[str]] = {}
    for raw in sorted({*available, *must_include}, key=lambda i: (parse_device_id(i)[0], parse_device_id(i)[1])):
        found.setdefault(parse_device_id(raw)[0], []).append(raw)
    return found


def _offered_only(ledger: NodeLedger, offered: Collection[CardUuid]) -> NodeState:
    """The node with every card idle where kubelet offers a slot and unusable elsewhere."""
    state = from_ledger(NodeLedger(ledger.node))
    cards = tuple(
        card if uuid in offered else dataclasses.replace(card, healthy=False)
        for card, uuid in zip(state.cards, (c.uuid for c in ledger.node.cards), strict=True)
    )
    return dataclasses.replace(state, cards=cards)
