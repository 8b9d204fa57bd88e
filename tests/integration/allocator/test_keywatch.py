"""The ledger's key watch against a real nats-server: values in order, and a watch whose consumer
is gone (its server died) or that missed a value says so within seconds."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from gpuledger_common.store import LEDGER_BUCKET, LedgerStore
from gpuledger_common.store.follow import node_ledger
from gpuledger_common.store.keywatch import KeyWatch, WatchLost
from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Card, Node
from tests.support.replicas import wait_for
from tests.support.waiting import polled

from ..leftovers import running_tasks

pytestmark = pytest.mark.timeout(60)
STREAM = f"KV_{LEDGER_BUCKET}"


def ledger(name: str, memory_mib: int = 7611) -> NodeLedger:
    return NodeLedger(Node(NodeName(name), (Card(CardUuid(f"GPU-{name}"), 0, "Tesla P4", memory_mib),)))


async def consumers(nc: Client) -> int:
    info = await nc.jetstream().stream_info(STREAM)
    return int(info.state.consumer_count)


async def test_the_last_value_of_each_key_then_every_change_in_order(nc: Client) -> None:
    store = await LedgerStore.open(nc)
    await store.mutate("a", lambda _: ledger("a"))
    await store.mutate("a", lambda _: ledger("a", 8000))
    await store.mutate("b", lambda _: ledger("b"))
    seen: list[tuple[str, int]] = []
    watch = store.key_watch(None, lambda msg: seen.append((msg.subject.rsplit(".", 1)[1], len(msg.data))))
    await watch.start()
    try:
        await wait_for(polled(lambda: len(seen) == 2), 10, "each key's last value")
        assert [key for key, _ in seen] == ["a", "b"]  # the last of each key, not a's history
        await store.mutate("a", lambda _: ledger("a", 9000))
        await store.mutate("b", lambda _: None)  # a deleted key arrives too (its marker)
        await wait_for(polled(lambda: len(seen) == 4), 10, "both changes")
        assert [key for key, _ in seen[2:]] == ["a", "b"]
        await asyncio.sleep(1.5 * watch.heartbeat_s)  # quiet: only heartbeats come, and nothing is lost
        assert watch.failed is None
    finally:
        await watch.stop()
    assert await consumers(nc) == 0  # stopping asks the server to drop the consumer


async def test_a_watch_whose_consumer_is_gone_fails_within_seconds(nc: Client) -> None:
    """As when the consumer's server dies while this client's connection lives on another one:
    nothing arrives any more, not even an error."""
    store = await LedgerStore.open(nc)
    await store.mutate("a", lambda _: ledger("a"))
    watch = await store.key_watch("a", lambda msg: None).start()
    try:
        await asyncio.sleep(watch.heartbeat_s)
        assert watch.failed is None
        gone = time.monotonic()
        await nc.jetstream().delete_consumer(STREAM, watch._consumer)
        await wait_for(polled(lambda: watch.failed is not None), 10, "the watch saying it is lost")
        took = time.monotonic() - gone
    finally:
        await watch.stop()
    assert isinstance(watch.failed, WatchLost)
    assert "nothing from its consumer" in str(watch.failed)
    assert took <= watch.missed_s + watch.heartbeat_s  # nats-py's own check took two 5 s heartbeats


async def test_a_skipped_value_fails_the_watch_and_nothing_after_it_is_handed_on(nc: Client) -> None:
    handed: list[int] = []
    watch = KeyWatch(nc, nc.jetstream(), STREAM, "$KV.gpuledger-ledger.node.x", lambda m: handed.append(1))

    def value(consumer_sequence: int) -> Msg:
        reply = f"$JS.ACK.{STREAM}.c.1.{consumer_sequence + 10}.{consumer_sequence}.0.0"
        return Msg(nc, subject="$KV.gpuledger-ledger.node.x", reply=reply, data=b"{}")

    await watch._on_msg(value(1))
    await watch._on_msg(value(3))  # value 2 never arrived
    await watch._on_msg(value(4))
    assert handed == [1]
    assert isinstance(watch.failed, WatchLost) and "skipped from value 1 to 3" in str(watch.failed)


async def test_a_heartbeat_that_counts_more_values_than_arrived_fails_the_watch(nc: Client) -> None:
    watch = KeyWatch(nc, nc.jetstream(), STREAM, "$KV.gpuledger-ledger.node.x", lambda m: None)
    heartbeat = Msg(nc, subject="_INBOX.x", headers={"Status": "100", "Nats-Last-Consumer": "2"})
    await watch._on_msg(heartbeat)
    assert isinstance(watch.failed, WatchLost) and "delivered 2 values, 0 arrived" in str(watch.failed)


async def test_a_node_watch_ends_at_once_whenever_its_task_is_cancelled(nc: Client) -> None:
    """And its consumer is dropped. (Its loop waits with no timeout: a loop of ``wait_for`` lost a
    cancellation now and then in Python 3.11, and a plugin shim's stop then hung until its test
    timed out, about one run of the plugin identity tests in five.)"""
    store = await LedgerStore.open(nc)
    await store.mutate("a", lambda _: ledger("a"))
    rng = random.Random(5)
    for _ in range(20):
        first = asyncio.Event()

        async def follow(seen: asyncio.Event) -> None:
            async for _value in node_ledger(store, "a"):
                seen.set()

        task = asyncio.create_task(follow(first))
        async with asyncio.timeout(10):
            await first.wait()
        await asyncio.sleep(rng.uniform(0, 0.3))
        task.cancel()
        async with asyncio.timeout(3):  # stopping the watch asks the server to drop its consumer
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert await consumers(nc) == 0


async def test_a_node_watch_closed_between_values_ends_its_tasks_as_it_closes(nc: Client) -> None:
    """A consumer that closes the watch while it waits at its ``yield`` (``aclosing``: a consumer
    cancelled while it handles a value) finds the watch's own tasks, the resilient pump and its
    watchdog, ended once the close returns: not left to the garbage collector's finalizer."""
    store = await LedgerStore.open(nc)
    await store.mutate("a", lambda _: ledger("a"))
    before = running_tasks()
    async with contextlib.aclosing(node_ledger(store, "a")) as ledgers:
        assert (await anext(ledgers)) is not None
        assert running_tasks() - before  # the pump's
    assert not running_tasks() - before
