"""``gpuledger alloc`` when the allocator cannot answer: a clear error and exit code 5, never a
traceback, and, when the CLI made up the owner, the owner to ask again with (the allocation may
have been written; only the same owner finds it)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from gpuledger_cli.__main__ import main
from gpuledger_dev.natsserver import free_port


@pytest.fixture
def silent() -> Iterator[str]:
    """An address that takes connections and never answers."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        yield f"127.0.0.1:{listening.getsockname()[1]}"


def test_an_allocator_that_does_not_answer_is_named_with_the_owner_to_ask_again(
    silent: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["alloc", "--server", silent, "--timeout", "0.5", "--gpu-mem", "1000"]) == 5
    err = capsys.readouterr().err
    assert f"the allocator at {silent} did not answer within 0.5s (--timeout)" in err
    owner = re.search(r"this request's owner was (cli-[0-9a-f]{8}): run again with --owner \1\b", err)
    assert owner is not None, err
    assert "Traceback" not in err


def test_an_unreachable_allocator_with_a_given_owner(capsys: pytest.CaptureFixture[str]) -> None:
    server = f"127.0.0.1:{free_port()}"
    assert main(["alloc", "--server", server, "--timeout", "2", "--owner", "job-7"]) == 5
    err = capsys.readouterr().err
    assert f"cannot reach the allocator at {server}" in err
    assert "run again with --owner" not in err  # the caller knows its owner
