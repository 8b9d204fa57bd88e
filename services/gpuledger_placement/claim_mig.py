"""Mode C makes a claim's MIG instances before it writes the claim's allocation (docs/mig.md, "DRA:
partitionable devices"): the node's inventory is asked (``mig.make``, as the device plugin asks at
Allocate and the DRA plugin at Prepare), so that an instance the node cannot make is rolled back in
the ledger while the claim is still unallocated and its pod still gated, and tried again later,
rather than failing the pod's Prepare on a node it is already bound to. Prepare asks again and
finds the instance made (``mig.make`` is idempotent); an on-demand instance nobody holds any more is
destroyed by the node's inventory after its keep time, as any other."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.mig import placement_text
from gpuledger_core.model import Allocation, MigSlot

Make = Callable[[str, str, MigSlot, str], Awaitable[MadeMig]]  # node, card uuid, placement, holder


async def make_instances(make: Make, allocation: Allocation) -> str:
    """Have the allocation's node make each MIG instance it holds (its id the holder); empty when
    every one exists, else why one could not be made, naming node, card and profile."""
    for share in allocation.shares():
        if share.mig is None:
            continue
        try:
            await make(str(allocation.node), str(share.uuid), share.mig, str(allocation.id))
        except GpuledgerError as err:
            what = placement_text(share.mig, share.index, share.uuid)
            return f"the {what} of node {allocation.node} could not be made: {err}"
    return ""
