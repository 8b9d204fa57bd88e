"""Small ledgers for the plugin's pure tests."""

from __future__ import annotations

from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import (
    CORE_WHOLE,
    Allocation,
    Card,
    CardShare,
    Grant,
    Isolation,
    Link,
    Node,
    Owner,
    OwnerKind,
    PcieLevel,
)
from gpuledger_core.slots import assign_device_ids

SLOTS = 4


def node(cards: int = 4, models: tuple[str, ...] = ()) -> Node:
    links = tuple(
        Link(
            a,
            b,
            4 if b == a + 1 and a % 2 == 0 else 0,
            PcieLevel.SINGLE_SWITCH if a // 2 == b // 2 else PcieLevel.SYSTEM,
        )
        for a in range(cards)
        for b in range(a + 1, cards)
    )
    return Node(
        NodeName("n1"),
        tuple(
            Card(
                CardUuid(f"GPU-{i}"),
                i,
                models[i] if models else "H100",
                81920,
                numa=i // 2,
                minor=i,
            )
            for i in range(cards)
        ),
        links,
    )


def share(card: int, mem: int = 1024, core: int = 100, exclusive: bool = False) -> CardShare:
    if exclusive:
        return CardShare(CardUuid(f"GPU-{card}"), card, 81920, CORE_WHOLE, True)
    return CardShare(CardUuid(f"GPU-{card}"), card, mem, core)


def pod(
    name: str, *grants: Grant, created: float = 0.0, isolation: Isolation = Isolation.NONE
) -> Allocation:
    owner = Owner(OwnerKind.POD, f"uid-{name}", "ns", name)
    return Allocation(
        AllocationId(f"a-{name}"),
        owner,
        NodeName("n1"),
        grants,
        isolation=isolation,
        created_at=created,
    )


def ledger_with(*allocations: Allocation, n: Node | None = None) -> NodeLedger:
    ledger = NodeLedger(n or node())
    for allocation in allocations:
        ledger = reserve(ledger, assign_device_ids(ledger, allocation, SLOTS))
    return ledger


def ids_of(ledger: NodeLedger, name: str, index: int = 0) -> tuple[str, ...]:
    found = ledger.get(AllocationId(f"a-{name}"))
    assert found is not None
    return found.grants[index].device_ids
