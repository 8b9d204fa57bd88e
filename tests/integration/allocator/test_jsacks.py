"""The ledger's JetStream publishes with their acks on one inbox of its own (``jsacks``), against a
real nats-server: the sequence an ack names, a refused conditional write, no stream, no ack in
time, and acks of publishes in flight together each reaching their own caller."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, NoStreamResponseError

from gpuledger_common.store.jsacks import Acks

STREAM, SUBJECT = "ACKS", "acks.one"


@pytest.fixture
async def acks(nc: Client) -> Acks:
    await nc.jetstream().add_stream(name=STREAM, subjects=["acks.>"])
    return Acks(nc)


async def test_the_ack_names_the_sequence_the_stream_stored_the_message_at(nc: Client, acks: Acks) -> None:
    first = await acks.publish(SUBJECT, b"a", {}, 2.0)
    second = await acks.publish(SUBJECT, b"b", {}, 2.0)
    assert (first, second) == (1, 2)
    stored = await nc.jetstream().get_msg(STREAM, seq=second)
    assert stored.data == b"b"


async def test_a_conditional_write_on_a_stale_sequence_is_refused_naming_the_current_one(acks: Acks) -> None:
    await acks.publish(SUBJECT, b"a", {}, 2.0)
    now = await acks.publish(SUBJECT, b"b", {"Nats-Expected-Last-Subject-Sequence": "1"}, 2.0)
    with pytest.raises(APIError) as refused:
        await acks.publish(SUBJECT, b"c", {"Nats-Expected-Last-Subject-Sequence": "1"}, 2.0)
    assert refused.value.err_code == 10071
    assert f"wrong last sequence: {now}" in str(refused.value.description)


async def test_a_subject_no_stream_takes_says_so(acks: Acks) -> None:
    with pytest.raises(NoStreamResponseError):
        await acks.publish("nobody.listens", b"a", {}, 2.0)


async def test_an_ack_that_does_not_come_in_time_is_a_nats_timeout(nc: Client, acks: Acks) -> None:
    async def silent(_: Msg) -> None:  # takes the message, answers nothing
        return None

    await nc.subscribe("silent.one", cb=silent)
    await nc.flush()
    with pytest.raises(NatsTimeout):
        await acks.publish("silent.one", b"a", {}, 0.2)
    assert not acks._waiting  # nothing left behind for an ack that never came


async def test_acks_of_publishes_in_flight_together_reach_their_own_callers(nc: Client, acks: Acks) -> None:
    bodies = [f"m{i}".encode() for i in range(40)]
    sequences = await asyncio.gather(*(acks.publish(f"acks.{i}", body, {}, 2.0) for i, body in enumerate(bodies)))
    assert sorted(sequences) == list(range(1, 41))
    js = nc.jetstream()
    for body, sequence in zip(bodies, sequences, strict=True):
        assert (await js.get_msg(STREAM, seq=sequence)).data == body
