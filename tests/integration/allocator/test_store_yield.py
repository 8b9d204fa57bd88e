"""A writer that keeps losing races on a node asks the other writers to hold their next write to
it (core NATS, ``gpuledger.v1.ledger.yield``), against a real nats-server: a followed store asks
after two lost races in a row, a store asked holds its next write for ``yield_s`` so the other
gets in first, and a request to yield is taken only from another writer, for a node the store
knows, not twice in a row, and not from a JetStream consumer aimed at the yield subject."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyWrongLastSequenceError
from prometheus_client import REGISTRY

from gpuledger_common.natsauth import LEDGER_YIELD
from gpuledger_common.store import LEDGER_BUCKET, LedgerStore, node_key
from gpuledger_common.store.writes import Writes
from gpuledger_core.ledger import NodeLedger
from tests.support.waiting import polled, wait_for

from .test_store import NODE, ledger, take
from .test_store_batches import held

PAUSE_S = 0.5  # long beside a write on loopback, so the order below does not race
LONG_PAUSE_S = 6.0  # a pause that only the other writer's write arriving can end in time


def taken() -> float:
    return REGISTRY.get_sample_value("gpuledger_ledger_yields_total", {"way": "taken"}) or 0.0


def forged() -> float:
    return REGISTRY.get_sample_value("gpuledger_ledger_yields_total", {"way": "forged"}) or 0.0


@pytest.fixture
async def followed(nc: Client) -> AsyncIterator[LedgerStore]:
    """A store a watch feeds, as the allocator's and placement's are, with the node written."""
    store = await LedgerStore.open(nc)
    store.yield_s = PAUSE_S
    await store.mutate(NODE, lambda _: ledger())
    following = await store.follow_values(store.remember, lambda: None)
    await wait_for(polled(lambda: NODE in store._known.latest), 5, "the node known from the watch")
    yield store
    await following.stop()


@pytest.fixture
async def asked(nc: Client) -> AsyncIterator[list[bytes]]:
    """Every request to yield published, as it arrives."""
    heard: list[bytes] = []

    async def hear(msg: Msg) -> None:
        heard.append(msg.data)

    sub = await nc.subscribe(LEDGER_YIELD, cb=hear)
    await nc.flush()
    yield heard
    await sub.unsubscribe()


def lose_two_races(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every store's first two writes from now on refused as lost races; the revisions written on."""
    real_write, calls = Writes._write, []

    async def loses_twice(self: Writes, node: str, new: NodeLedger | None, revision: int) -> int:
        calls.append(revision)
        if len(calls) <= 2:  # as if another process had won the race, twice
            raise KeyWrongLastSequenceError(description=f"wrong last sequence: {revision}")
        return await real_write(self, node, new, revision)

    monkeypatch.setattr(Writes, "_write", loses_twice)
    return calls


async def ask(nc: Client, payload: bytes) -> None:
    await nc.publish(LEDGER_YIELD, payload)
    await nc.flush()


async def test_a_store_asked_to_yield_lets_the_other_writer_in_first(nc: Client, followed: LedgerStore) -> None:
    """The pause ends as soon as the other writer's write arrives, well before ``yield_s``."""
    followed.yield_s = LONG_PAUSE_S
    other = await LedgerStore.open(nc)
    before = taken()
    await ask(nc, b"another-writer " + NODE.encode())
    await wait_for(polled(lambda: taken() > before), 5, "the request to yield taken")

    held_back = asyncio.create_task(followed.mutate(NODE, take("held", 1000)))
    await asyncio.sleep(0.1)
    assert not held_back.done(), "the write went out although another writer asked to go first"
    first = await other.mutate(NODE, take("first", 1000))
    second = await asyncio.wait_for(held_back, LONG_PAUSE_S / 2)  # not held for the whole pause

    assert first.revision < second.revision
    final, _ = await other.read(NODE)
    assert held(final) == {"first", "held"}


async def test_a_request_to_yield_is_not_taken_from_itself_for_an_unknown_node_or_twice_in_a_row(
    nc: Client, followed: LedgerStore
) -> None:
    before = taken()
    await ask(nc, followed._yielding.writer + b" " + NODE.encode())  # its own
    await ask(nc, b"another-writer no-such-node")
    await ask(nc, b"nonsense")
    await ask(nc, b"another-writer " + NODE.encode())  # taken
    await ask(nc, b"another-writer " + NODE.encode())  # too soon after: not taken
    await wait_for(polled(lambda: taken() > before), 5, "the request to yield taken")
    await nc.flush()
    await asyncio.sleep(0.05)  # the later requests delivered too
    assert taken() == before + 1

    await asyncio.sleep(2 * PAUSE_S + 0.1)
    await ask(nc, b"another-writer " + NODE.encode())  # as long again after the pause: taken
    await wait_for(polled(lambda: taken() == before + 2), 5, "the next request to yield taken")


async def test_a_followed_store_asks_the_others_to_yield_after_two_lost_races_in_a_row(
    followed: LedgerStore, asked: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = lose_two_races(monkeypatch)
    written = await followed.mutate(NODE, take("patient", 1000))

    assert held(written.new) == {"patient"}
    assert len(calls) == 3
    await wait_for(polled(lambda: asked), 5, "a request to yield")
    assert asked == [followed._yielding.writer + b" " + NODE.encode()]  # after the second loss only


async def test_a_store_without_a_watch_never_asks(
    nc: Client, asked: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await LedgerStore.open(nc)  # as the plugin's: it reads before it writes
    await store.mutate(NODE, lambda _: ledger())
    calls = lose_two_races(monkeypatch)
    await store.mutate(NODE, take("patient", 1000))
    await nc.flush()
    await asyncio.sleep(0.05)

    assert len(calls) == 3 and not asked


async def test_a_request_to_yield_delivered_by_a_consumer_is_dropped_and_counted(
    nc: Client, followed: LedgerStore
) -> None:
    """A node may write any bytes to its own key and have a consumer of its own deliver them to any
    subject (nats-server does not check a consumer's deliver subject against its maker's
    permissions): here a request to yield ``NODE``, from the key of a node "rogue", delivered on
    the yield subject. It keeps the stream's subject and is no writer's request: dropped, counted,
    and ``NODE``'s next write is not held."""
    followed.yield_s = LONG_PAUSE_S
    before_taken, before_forged = taken(), forged()
    rogue = f"$KV.{LEDGER_BUCKET}.{node_key('rogue')}"
    await nc.jetstream().publish(rogue, b"another-writer " + NODE.encode())
    config = ConsumerConfig(
        deliver_subject=LEDGER_YIELD,
        filter_subject=rogue,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE,
    )
    await nc.jetstream().add_consumer(f"KV_{LEDGER_BUCKET}", config)
    await wait_for(polled(lambda: forged() > before_forged or taken() > before_taken), 5, "the delivery heard")

    assert (taken(), forged()) == (before_taken, before_forged + 1)
    written = await asyncio.wait_for(followed.mutate(NODE, take("not-held", 1000)), LONG_PAUSE_S / 2)
    assert held(written.new) == {"not-held"}
