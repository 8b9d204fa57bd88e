"""How the gRPC edge names each error: by its kind, so a narrower error keeps its family's status."""

from __future__ import annotations

import pytest
from grpclib.const import Status

from gpuledger_allocator.api_grpc import to_grpc
from gpuledger_core import errors


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.NotFound("allocation a-1 is not on node n0"), Status.NOT_FOUND),
        (errors.FailedPrecondition("allocation a-1 already exists"), Status.FAILED_PRECONDITION),
        (errors.Released("allocation a-1 was released (lease expired)"), Status.FAILED_PRECONDITION),
        (errors.Unavailable("no stream leader answered"), Status.UNAVAILABLE),
        (errors.GpuledgerError("something else"), Status.INTERNAL),
    ],
)
def test_an_error_is_answered_with_its_familys_status(error: errors.GpuledgerError, status: Status) -> None:
    answer = to_grpc(error)
    assert (answer.status, answer.message) == (status, str(error))
