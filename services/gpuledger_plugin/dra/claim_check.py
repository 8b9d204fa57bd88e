"""The DRA plugin's ledger check: a claim is prepared only if the ledger holds it.

Placement's claims controller reserves each DRA allocation of our driver in the node's ledger
(``gpuledger_placement.claims``) before kube-scheduler may bind the pod (binding conditions), or
mirrors it where the pool is published without them. At NodePrepareResources the plugin reads its
node's ledger and refuses a claim the ledger does not hold as allocated: kubelet tries the prepare
again (the pod stays in ContainerCreating, with the reason in its events) until the entry is there
or the claim goes. Unprepare leaves the entry: the controller releases it when the claim's
allocation is cleared or the claim deleted, which the node cannot see sooner than the API server.
"""

from __future__ import annotations

from gpuledger_common.store import LedgerStore
from gpuledger_core import claims
from gpuledger_core.claims import ClaimAllocation
from gpuledger_core.errors import FailedPrecondition


class LedgerEntryCheck:
    def __init__(self, store: LedgerStore, node: str) -> None:
        self.store, self.node = store, node

    async def check(self, allocation: ClaimAllocation) -> None:
        ref = allocation.ref
        ledger, _ = await self.store.read(self.node)
        if ledger is None:
            raise FailedPrecondition(f"node {self.node} is not in the ledger: {ref.describe()} cannot be checked")
        entry = ledger.of_owner(ref.owner.key)
        if entry is None:
            raise FailedPrecondition(
                f"{ref.describe()}: the ledger of {self.node} holds no entry for it (placement's claims "
                "controller has not reserved it yet, or refused it)"
            )
        wanted = claims.allocation_id(ref, allocation.devices)
        if entry.id != wanted:
            raise FailedPrecondition(
                f"{ref.describe()}: the ledger holds {entry.id} for it, not the allocation kubelet prepares "
                f"({wanted}): it was allocated again and the ledger has not caught up"
            )

    async def release(self, claim_uid: str) -> None:
        return None  # the claims controller releases the entry once the allocation is cleared
