"""Changes of one node queued behind a write in flight go out together in the next compare-and-set,
against a real nats-server: each caller still gets its own answer, a refusal or a lost race hits
only its own caller, and a change no write has taken when its caller's window ends is never written."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js.errors import APIError, KeyWrongLastSequenceError

from gpuledger_common.store import OWNER_BUCKET, LedgerStore, Written
from gpuledger_common.store.jsacks import Acks
from gpuledger_common.store.outage import within
from gpuledger_common.store.writes import Writes
from gpuledger_core.errors import Conflict, Exhausted, Unavailable
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Owner, OwnerKind

from .test_store import NODE, ledger, take


def held(value: NodeLedger | None) -> set[str]:
    assert value is not None
    return {str(a.id) for a in value.live()}


def stalled_writes(
    monkeypatch: pytest.MonkeyPatch, stalls: Callable[[NodeLedger | None], bool] = lambda _: True
) -> asyncio.Event:
    """Hold each of the store's writes whose new value ``stalls`` picks until the event returned is set."""
    real_write, release = Writes._write, asyncio.Event()

    async def stalled(self: Writes, node: str, new: NodeLedger | None, revision: int) -> int:
        if stalls(new):
            await release.wait()
        return await real_write(self, node, new, revision)

    monkeypatch.setattr(Writes, "_write", stalled)
    return release


async def test_changes_queued_behind_a_write_go_out_in_one_and_each_caller_sees_its_own(nc: Client) -> None:
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: ledger())
    writes = store.stats.writes

    answers = await asyncio.gather(*(store.mutate(NODE, take(f"t{i}", 500)) for i in range(8)))

    # the first goes out alone; the seven queued behind it make one write
    assert store.stats.writes - writes == 2
    for i, written in enumerate(answers):
        assert f"t{i}" in held(written.new)
    final, revision = await store.read(NODE)
    assert held(final) == {f"t{i}" for i in range(8)}
    assert answers[-1].revision == revision


async def test_a_lone_change_is_written_from_its_callers_own_task(nc: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: ledger())
    real_write, writers = Writes._write, []

    async def noted(self: Writes, node: str, new: NodeLedger | None, revision: int) -> int:
        writers.append(asyncio.current_task())
        return await real_write(self, node, new, revision)

    monkeypatch.setattr(Writes, "_write", noted)
    caller = asyncio.ensure_future(store.mutate(NODE, take("alone", 1000)))
    written = await caller

    assert writers == [caller]
    assert held(written.new) == {"alone"}
    assert not store.crowded()  # nothing left in flight


async def test_a_caller_cancelled_during_its_own_write_leaves_the_node_to_the_changes_behind_it(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: ledger())
    stalled_writes(monkeypatch, lambda new: new is not None and new.get(AllocationId("gone")) is not None)
    gone = asyncio.ensure_future(store.mutate(NODE, take("gone", 1000)))
    await asyncio.sleep(0.05)
    behind = asyncio.ensure_future(store.mutate(NODE, take("behind", 1000)))
    await asyncio.sleep(0.05)
    assert not behind.done()  # queued behind the write in flight

    gone.cancel()
    written = await asyncio.wait_for(behind, 5)

    assert gone.cancelled()
    assert held(written.new) == {"behind"}
    final, _ = await store.read(NODE)
    assert held(final) == {"behind"}
    assert not store.crowded()


async def test_a_refusal_in_a_batch_is_its_own_callers_only(nc: Client) -> None:
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: ledger())  # one card of 7611 MiB

    _, a, b, c = await asyncio.gather(
        store.mutate(NODE, take("first", 1000)),
        store.mutate(NODE, take("a", 3000)),
        store.mutate(NODE, take("b", 7000)),  # after first and a, no room: refused
        store.mutate(NODE, take("c", 3000)),  # still fits after b's refusal
        return_exceptions=True,
    )

    assert isinstance(b, Exhausted)
    assert not isinstance(a, BaseException) and not isinstance(c, BaseException)
    assert held(c.new) == {"first", "a", "c"}
    final, _ = await store.read(NODE)
    assert held(final) == {"first", "a", "c"}


async def test_a_caller_that_takes_one_attempt_moves_on_while_the_others_of_its_batch_retry(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: ledger())
    real_write, calls = Writes._write, []

    async def loses_the_second(self: Writes, node: str, new: NodeLedger | None, revision: int) -> int:
        calls.append(revision)
        if len(calls) == 2:  # the batch's first attempt, as if another process had won the race
            raise KeyWrongLastSequenceError(description=f"wrong last sequence: {revision + 1}")
        return await real_write(self, node, new, revision)

    monkeypatch.setattr(Writes, "_write", loses_the_second)
    _, once, patient = await asyncio.gather(
        store.mutate(NODE, take("first", 1000)),
        store.mutate(NODE, take("once", 1000), attempts=1),
        store.mutate(NODE, take("patient", 1000)),
        return_exceptions=True,
    )

    assert isinstance(once, Conflict), once
    assert not isinstance(patient, BaseException) and held(patient.new) == {"first", "patient"}
    final, _ = await store.read(NODE)
    assert held(final) == {"first", "patient"}
    assert len(calls) == 3


async def test_a_change_still_queued_when_its_window_ends_is_refused_and_never_written(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: ledger())
    release = stalled_writes(monkeypatch)  # the write ahead waits out an outage
    ahead = asyncio.ensure_future(store.mutate(NODE, take("ahead", 1000)))
    await asyncio.sleep(0.05)

    async def late() -> None:
        with within(0.3):
            await store.mutate(NODE, take("late", 1000))

    with pytest.raises(Unavailable, match="ahead of this one are still waiting"):
        await late()
    release.set()
    written = await ahead
    assert held(written.new) == {"ahead"}
    await asyncio.sleep(0.1)  # no later write takes the refused change
    final, _ = await store.read(NODE)
    assert held(final) == {"ahead"}
    assert final is not None and final.get(AllocationId("late")) is None


async def test_a_refusal_naming_no_revision_while_the_key_stands_still_is_waited_out_not_counted_as_a_race(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream leader with an uncommitted write to a key refuses later conditional writes to it
    with "wrong last sequence" and no revision (NATS 10164); a leader that lost its quorum keeps
    doing so. No other write won, so the call waits (within its window) instead of spending its
    attempts, and says what is wrong when the window ends."""
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: ledger())
    real_put, refusals = Writes._put, [5]

    async def pending_at_leader(self: Writes, key: str, data: bytes, revision: int) -> int:
        if refusals[0] > 0:
            refusals[0] -= 1
            raise KeyWrongLastSequenceError(description="wrong last sequence")
        return await real_put(self, key, data, revision)

    monkeypatch.setattr(Writes, "_put", pending_at_leader)
    written = await store.mutate(NODE, take("patient", 1000), attempts=1)  # one attempt, five refusals
    assert held(written.new) == {"patient"}

    refusals[0] = 10**6  # the leader never commits: the window ends
    with within(0.5), pytest.raises(Unavailable, match=r"cannot commit .*lost its quorum"):
        await store.mutate(NODE, take("never", 1000))
    final, _ = await store.read(NODE)
    assert held(final) == {"patient"}


async def test_a_batch_rides_out_an_outage_for_each_callers_own_window(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch waits out an outage for the shortest window among its callers; the caller whose
    window ends is refused, and the others are written once JetStream answers again."""
    store = await LedgerStore.open(nc)
    await store.mutate(NODE, lambda _: ledger())
    real_put, release, back_at = Writes._put, asyncio.Event(), [0.0]

    async def out_for_a_while(self: Writes, key: str, data: bytes, revision: int) -> int:
        if not release.is_set():
            await release.wait()  # the write ahead, until both callers below are queued behind it
        elif time.monotonic() < back_at[0]:
            raise NoRespondersError  # no stream leader
        return await real_put(self, key, data, revision)

    monkeypatch.setattr(Writes, "_put", out_for_a_while)
    ahead = asyncio.ensure_future(store.mutate(NODE, take("ahead", 1000)))
    await asyncio.sleep(0.05)

    async def within_s(seconds: float, name: str) -> object:
        with within(seconds):
            return await store.mutate(NODE, take(name, 1000))

    short = asyncio.ensure_future(within_s(0.5, "short"))
    long = asyncio.ensure_future(within_s(5.0, "long"))
    await asyncio.sleep(0.05)
    back_at[0] = time.monotonic() + 1.5  # JetStream answers again after the short window, inside the long
    release.set()
    await ahead
    with pytest.raises(Unavailable):
        await short
    written = await long
    assert isinstance(written, Written) and held(written.new) == {"ahead", "long"}
    final, _ = await store.read(NODE)
    assert held(final) == {"ahead", "long"}


async def test_an_owner_record_refused_with_no_revision_while_it_stands_still_is_waited_out(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same refusal on the owner index is no other holder's record in the way: the write waits
    (within its window) and goes in, and when the window ends it says what is wrong."""
    store = await LedgerStore.open(nc)
    owner = Owner(OwnerKind.TOOL, "patient")
    real_publish, refusals = Acks.publish, [5]

    async def pending_at_leader(self: Acks, subject: str, *args: Any, **kwargs: Any) -> Any:
        if subject.startswith(f"$KV.{OWNER_BUCKET}.") and refusals[0] > 0:
            refusals[0] -= 1
            raise APIError(code=400, err_code=10164, description="wrong last sequence")
        return await real_publish(self, subject, *args, **kwargs)

    monkeypatch.setattr(Acks, "publish", pending_at_leader)
    revision = await store.claim_owner(owner, AllocationId("a-1"), NODE)
    assert revision is not None and refusals == [0]  # its own record, not someone else's
    record = await store.owner_record(owner)
    assert record is not None and record.allocation == "a-1"

    refusals[0] = 10**6  # the leader never commits: the window ends
    with within(0.5), pytest.raises(Unavailable, match=r"owner index: .*cannot commit .*lost its quorum"):
        await store.claim_owner(owner, AllocationId("a-2"), NODE, revision)
    record = await store.owner_record(owner)
    assert record is not None and record.allocation == "a-1"
