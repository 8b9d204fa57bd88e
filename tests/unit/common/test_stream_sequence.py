"""``stream_sequence`` reads a delivery's stream sequence as nats-py's full metadata does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from gpuledger_common.store import stream_sequence

NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)
NUMBER = st.integers(min_value=0, max_value=2**63 - 1)


def delivered(reply: str) -> Msg:
    return Msg(None, subject="$KV.gpuledger-ledger.node.n0", reply=reply, data=b"{}")  # type: ignore[arg-type]


@given(stream=NAME, consumer=NAME, numbers=st.lists(NUMBER, min_size=5, max_size=5))
def test_the_first_form(stream: str, consumer: str, numbers: list[int]) -> None:
    reply = ".".join(["$JS", "ACK", stream, consumer, *map(str, numbers)])
    assert stream_sequence(delivered(reply)) == delivered(reply).metadata.sequence.stream == numbers[1]


@given(domain=NAME, account=NAME, stream=NAME, consumer=NAME, numbers=st.lists(NUMBER, min_size=5, max_size=5))
def test_the_form_with_domain_and_account(
    domain: str, account: str, stream: str, consumer: str, numbers: list[int]
) -> None:
    reply = ".".join(["$JS", "ACK", domain, account, stream, consumer, *map(str, numbers), "token"])
    assert stream_sequence(delivered(reply)) == delivered(reply).metadata.sequence.stream == numbers[1]


def test_a_message_that_is_no_delivery_is_refused_as_nats_py_refuses_it() -> None:
    with pytest.raises(Exception) as theirs:  # noqa: PT011  # whatever nats-py raises for it
        _ = delivered("_INBOX.abc").metadata
    with pytest.raises(type(theirs.value)):
        stream_sequence(delivered("_INBOX.abc"))
