"""Who is calling the gRPC API, and what they may touch.

A caller is the common name of the client certificate it presented (mutual TLS; see
docs/security.md). An admin (named in ``grpc_admins``) may do anything. Anyone else owns the tool
allocations whose owner id is its identity or starts with ``<identity>/`` (a batch system
``slurm`` allocates as ``slurm/job-42``), and may allocate, commit, release, read, list and watch
only those; pods' allocations are Kubernetes' (placement binds them), not a tool's. With TLS off
(a development stack) every caller is an admin, as the start-up log warns.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from gpuledger_core.errors import PermissionDenied
from gpuledger_core.model import Allocation, Owner, OwnerKind


@dataclass(frozen=True, slots=True)
class Caller:
    identity: str
    admin: bool = False

    def owns(self, owner: Owner) -> bool:
        if self.admin:
            return True
        if owner.kind is not OwnerKind.TOOL or not self.identity:
            return False
        return owner.id == self.identity or owner.id.startswith(f"{self.identity}/")

    def check(self, owner: Owner, action: str) -> None:
        if not self.owns(owner):
            raise PermissionDenied(
                f"{self.identity or 'an anonymous caller'} may not {action} for {owner.describe()}: a tool "
                f"owns only tool allocations with owner id {self.identity!r} or {self.identity + '/…'!r}"
            )

    def sees(self, allocation: Allocation) -> bool:
        return self.owns(allocation.owner)


ANYONE = Caller("", admin=True)  # TLS off: no identity to check
current: ContextVar[Caller] = ContextVar("gpuledger_grpc_caller", default=ANYONE)
