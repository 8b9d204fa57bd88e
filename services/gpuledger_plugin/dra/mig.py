"""The MIG placements of a claim made before its CDI spec is written (DRA Prepare).

A device the slices publish as a MIG placement (``gpu-<i>-mig-<profile>-<start>``, with the
attributes ``profile``, ``migStart`` and ``migSize``) is an instance the node's inventory makes on
demand: Prepare asks it (``mig.make`` over NATS, ``gpuledger_plugin.mig_allocate.MigMaker``) for
the instance at that placement, made for the claim's ledger allocation (the holder), and the CDI
spec names the MIG device it answers with. The inventory answers an instance that exists as it is,
so a prepare tried again makes nothing twice. A placement it cannot make fails that claim's prepare
with the inventory's reason, naming the device, the card and the profile; kubelet tries again.
"""

from __future__ import annotations

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core import claims
from gpuledger_core.claims import ClaimAllocation
from gpuledger_core.errors import FailedPrecondition, GpuledgerError
from gpuledger_core.mig import placement_text
from gpuledger_plugin.dra.cdi import Card
from gpuledger_plugin.mig_allocate import MigMaker


async def made_for(maker: MigMaker, allocation: ClaimAllocation, cards: dict[str, Card]) -> dict[str, MadeMig]:
    """Device name -> the instance made for each MIG placement of the claim (none: no placement)."""
    holder = claims.allocation_id(allocation.ref, allocation.devices)
    found: dict[str, MadeMig] = {}
    for device in allocation.devices:
        card = cards.get(device.device)
        if card is None or card.mig is None:
            continue
        slot = card.mig
        try:
            found[device.device] = await maker.make(card.uuid, slot, holder)
        except GpuledgerError as err:
            what = placement_text(slot, card.index, card.uuid)
            problem = f"device {device.device}: the node's inventory did not make the {what}: {err}"
            raise FailedPrecondition(problem) from err
    return found
