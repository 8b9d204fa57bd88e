"""Errors by what the caller should do about them.

Every edge (gRPC, NATS, HTTP extender, kubelet) translates these once into its own status.
"""

from __future__ import annotations


class GpuledgerError(Exception):
    """Base of every error gpuledger raises on purpose."""

    code = "internal"


class InvalidArgument(GpuledgerError):
    """The request is malformed or impossible; retrying the same request will not help."""

    code = "invalid_argument"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class NotFound(GpuledgerError):
    """A node, card or allocation that does not exist (or no longer does)."""

    code = "not_found"


class Exhausted(GpuledgerError):
    """Valid, but nothing has room for it now; the message says which constraint failed."""

    code = "resource_exhausted"


class Conflict(GpuledgerError):
    """Someone else changed the same state first; re-read and retry."""

    code = "conflict"


class Unavailable(GpuledgerError):
    """A dependency (NATS, the allocator, Kubernetes) cannot be reached; retry later."""

    code = "unavailable"


class FailedPrecondition(GpuledgerError):
    """The target is in a state that forbids the operation (e.g. committing a released allocation)."""

    code = "failed_precondition"


class Released(FailedPrecondition):
    """The allocation was released (by a caller, or its reservation's lease ran out) before this
    operation reached it."""


class PermissionDenied(GpuledgerError):
    """The caller is who it says, and may not do this (another's allocation, a pod's); don't retry."""

    code = "permission_denied"


_BY_CODE: dict[str, type[GpuledgerError]] = {
    cls.code: cls
    for cls in (GpuledgerError, NotFound, Exhausted, Conflict, Unavailable, FailedPrecondition, PermissionDenied)
}


def from_code(code: str, message: str) -> GpuledgerError:
    """Rebuild an error sent over the wire as ``(code, message)``."""
    if code == InvalidArgument.code:
        field, _, problem = message.partition(": ")
        return InvalidArgument(field, problem or message)
    return _BY_CODE.get(code, GpuledgerError)(message)
