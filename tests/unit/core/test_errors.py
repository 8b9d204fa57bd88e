from __future__ import annotations

import pytest

from gpuledger_core.errors import (
    Conflict,
    Exhausted,
    FailedPrecondition,
    GpuledgerError,
    InvalidArgument,
    NotFound,
    Unavailable,
    from_code,
)


@pytest.mark.parametrize(
    "error",
    [
        GpuledgerError("boom"),
        NotFound("allocation a is not on node n"),
        Exhausted("n: card 0 has the most free memory, 963 MiB, 1597 MiB short of 2560 MiB"),
        Conflict("revision 7 is not 8"),
        Unavailable("nats: no servers"),
        FailedPrecondition("allocation a was released (lease expired)"),
        InvalidArgument("gpu-core", "must be 1..100 percent, got 100.1"),
        InvalidArgument("allocations[0].owner.kind", "must be one of pod|tool, got 'x: y'"),
    ],
)
def test_an_error_survives_the_wire(error: GpuledgerError) -> None:
    back = from_code(error.code, str(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    if isinstance(error, InvalidArgument):
        assert isinstance(back, InvalidArgument)
        assert (back.field, back.problem) == (error.field, error.problem)


def test_the_codes_are_distinct() -> None:
    kinds: list[type[GpuledgerError]] = [
        GpuledgerError,
        InvalidArgument,
        NotFound,
        Exhausted,
        Conflict,
        Unavailable,
        FailedPrecondition,
    ]
    assert len({k.code for k in kinds}) == len(kinds)


def test_an_unknown_code_is_a_plain_error() -> None:
    back = from_code("data_loss", "the disk ate it")
    assert type(back) is GpuledgerError
    assert str(back) == "the disk ate it"


def test_an_invalid_argument_without_a_field_keeps_the_message() -> None:
    back = from_code("invalid_argument", "malformed")
    assert isinstance(back, InvalidArgument)
    assert back.problem == "malformed"
