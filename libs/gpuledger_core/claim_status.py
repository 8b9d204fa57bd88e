"""A ResourceClaim's ``status.allocation`` written as kube-scheduler writes it, from the ledger's
allocation of the claim (pure): the way back of ``claims.ledger_allocation``, for DRA mode C, where
the ledger allocates the claim and kube-scheduler only puts its pod on the node
(docs/dra-mode-c.md).

One result per card of each grant (a grant is named after the claim's request, as
``ledger_allocation`` names them): driver, pool (the node), device ``gpu-<index>`` (for a MIG
share, its placement's device ``gpu-<index>-mig-<profile>-<start>``, with no share id). On a shareable
card (the slices publish ``allowMultipleAllocations`` when the node has more than one slot per
card) a result also has a fresh ``shareID`` and its ``consumedCapacity`` on the slices' grid:
memory rounded up to whole ``memory_step_mib`` (never past the whole card as published), compute
in whole percent rounded up, one slot; a whole card consumes every capacity's default (all of
it). ``nodeSelector`` holds the node by name, as kube-scheduler writes it for a node-local pool.
No ``bindingConditions``: the ledger has committed the allocation already, and kube-scheduler's
PreBind waits only for results that carry some.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpuledger_core.claims import DEVICE_PREFIX, MEMORY_STEP_MIB
from gpuledger_core.dra_mig import device_name
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import CORE_WHOLE, Allocation, CardShare, Node
from gpuledger_core.quantity import MIB


def allocation_status(
    allocation: Allocation,
    node: Node,
    driver: str,
    now: float,
    *,
    shareable: bool,
    memory_step_mib: int = MEMORY_STEP_MIB,
    chosen: Mapping[str, str] | None = None,
    configs: Sequence[Mapping[str, Any]] = (),
    share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> dict[str, Any]:
    """``status.allocation`` for ``allocation`` on ``node``. ``chosen``: for a request answered by
    one of its ``firstAvailable`` subrequests, the result's request as kube-scheduler names it
    (``main/sub``); ``configs``: the class's and the claim's configuration for these requests
    (``source`` ``FromClass``/``FromClaim``), copied as kube-scheduler copies them."""
    if allocation.node != node.name:
        raise InvalidArgument("node", f"allocation {allocation.id} is on {allocation.node}, not {node.name}")
    chosen = chosen or {}
    results = []
    for grant in allocation.grants:
        if not grant.cards:
            raise InvalidArgument("grants", f"allocation {allocation.id}: request {grant.container!r} holds no card")
        for share in grant.cards:
            result: dict[str, Any] = {
                "request": chosen.get(grant.container, grant.container),
                "driver": driver,
                "pool": str(node.name),
                "device": _device(share),
            }
            if shareable and share.mig is None:
                result["shareID"] = share_id()
                published = published_mib(node, share, memory_step_mib)
                result["consumedCapacity"] = consumed(share, published, memory_step_mib)
            results.append(result)
    devices: dict[str, Any] = {"results": results}
    if configs:
        devices["config"] = [dict(c) for c in configs]
    return {
        "devices": devices,
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [str(node.name)]}]}
            ]
        },
        "allocationTimestamp": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _device(share: CardShare) -> str:
    """The card's device, or its MIG placement's (which takes one allocation: no share id)."""
    if share.mig is not None:
        return device_name(share.index, share.mig.profile, share.mig.start)
    return f"{DEVICE_PREFIX}{share.index}"


def published_mib(node: Node, share: CardShare, memory_step_mib: int) -> int:
    """The card's memory as its slice publishes it: rounded down to whole steps."""
    card = next((c for c in node.cards if c.uuid == share.uuid), None)
    if card is None:
        raise InvalidArgument("cards", f"card {share.uuid} is not on node {node.name}")
    return card.memory_mib // memory_step_mib * memory_step_mib


def consumed(share: CardShare, published: int, memory_step_mib: int) -> dict[str, str]:
    """What the share consumes of the device's capacities, on the slices' request grid."""
    if share.exclusive:
        memory_mib, percent = published, 100
    else:
        memory_mib = min(published, -(-share.mem_mib // memory_step_mib) * memory_step_mib)
        percent = max(1, min(100, -(-share.core_milli * 100 // CORE_WHOLE)))
    return {"memory": str(memory_mib * MIB), "compute": str(percent), "slots": "1"}
