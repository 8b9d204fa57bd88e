"""A node's changes take turns in this process, and those asked meanwhile are written together.

Writes to one node from this process take turns, so compare-and-set only ever races with other
processes. The changes of a node asked while the process's write to it is in flight wait in a
queue, and the next write takes all of them: their transitions applied in the order asked, one
compare-and-set (group commit), each caller with its own answer. A change with no write to its
node in flight, none queued and no pause asked is a batch of one, written from its caller's own
task (``now``). A pause another writer asked (``yielding``) holds the node's next batch.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from dataclasses import dataclass, field
from typing import Any

from gpuledger_common.store.outage import ATTEMPT_S, MIN_ATTEMPT_S, time_left
from gpuledger_common.store.writes import Transition, Writes, Written
from gpuledger_core.errors import Conflict, Unavailable
from gpuledger_core.ledger import NodeLedger


@dataclass(slots=True, eq=False)
class _Turn:
    """One caller's change of a node's ledger, queued behind the write to that node in flight."""

    transition: Transition
    attempts: int
    done: asyncio.Future[Written]
    context: contextvars.Context  # the caller's, with its outage window
    deadline: float  # when that window ends (``time.monotonic``)
    refused: BaseException | None = None  # what the transition raised on the batch's last value
    dropped: bool = False  # answered already: out of the batch's later attempts


@dataclass(slots=True)
class Batches:
    writes: Writes
    asked: dict[str, float]  # ``Yielding.until``: a pause asked by another writer, per node
    paused: set[str] = field(default_factory=set)  # nodes whose next write waits out a pause now
    queued: dict[str, list[_Turn]] = field(default_factory=dict)  # changes waiting for the write ahead
    in_flight: dict[str, asyncio.Task[Any]] = field(default_factory=dict)  # the write in flight, per node

    async def in_turn(self, node: str, transition: Transition, attempts: int) -> Written:
        """Queue the change; the next write to the node takes it with every change queued beside it.
        With no write to the node in flight, none queued and no pause asked, the change is a batch of
        one, written from the caller's own task (``now``)."""
        if not (self._held_up(node) or node in self.asked or self.queued.get(node)):
            return await self.now(node, transition, attempts)
        retry_s = self.writes.buckets.retry_s
        done = asyncio.get_running_loop().create_future()
        turn = _Turn(transition, attempts, done, contextvars.copy_context(), time.monotonic() + time_left(retry_s))
        turn.done.add_done_callback(_retrieved)
        self.queued.setdefault(node, []).append(turn)
        self._next_batch(node)
        try:  # the writes ahead may be waiting out an outage: wait for them within this call's window
            async with asyncio.timeout(max(time_left(retry_s), MIN_ATTEMPT_S)):
                return await asyncio.shield(turn.done)
        except TimeoutError:
            if self._unqueued(node, turn):
                raise Unavailable(
                    f"cannot write the ledger of {node}: the writes to it ahead of this one are still waiting "
                    "out a JetStream outage"
                ) from None
        except asyncio.CancelledError:
            self._unqueued(node, turn)
            raise
        # A write has taken the change; it ends within the shortest window of its batch, this
        # call's or an earlier one, and then answers (a last request may take ATTEMPT_S).
        try:
            async with asyncio.timeout(ATTEMPT_S):
                return await asyncio.shield(turn.done)
        except TimeoutError:
            raise Unavailable(
                f"cannot write the ledger of {node}: no answer within the call's window (the write may still "
                "be applied)"
            ) from None

    async def now(self, node: str, transition: Transition, attempts: int) -> Written:
        """The change written by the caller's task, as the write in flight to the node: changes asked
        meanwhile queue behind it, and the next batch starts when it ends. A task of its own for the
        write, with the future, shield and timeouts around waiting on it, took 47 of the 162 us of
        CPU a lone write cost (docs/ledger.md). A caller cancelled meanwhile hears of it as it did
        from the queue; the write may land, and a watch brings it (or the next write reads it)."""
        task = asyncio.current_task()
        assert task is not None
        self.in_flight[node] = task
        try:
            return await self.writes.mutate(node, transition, attempts)
        finally:
            self._batch_done(node)

    def _unqueued(self, node: str, turn: _Turn) -> bool:
        """Take a change no write has taken yet out of the queue; False if one has."""
        queue = self.queued.get(node, [])
        if turn not in queue:
            return False
        queue.remove(turn)
        return True

    def _next_batch(self, node: str) -> None:
        """Start writing the node's queued changes, unless a write to it is in flight. The batch
        runs in the context of the caller with the least time left, so it rides out an outage
        for as long as that caller's window lasts (a caller with time left after it is queued
        again: each call waits out as much as its own window allows)."""
        if self._held_up(node) or not self.queued.get(node):
            return
        pause = self.asked.pop(node, 0.0) - time.monotonic()
        if pause > 0:  # another writer keeps losing races on the node: let it write first
            self.paused.add(node)
            asyncio.get_running_loop().call_later(pause, self.resume, node)
            return
        turns = self.queued.pop(node)
        context = min(turns, key=lambda t: t.deadline).context
        batch = asyncio.get_running_loop().create_task(self._write_batch(node, turns), context=context)
        self.in_flight[node] = batch
        batch.add_done_callback(lambda _: self._batch_done(node))

    def _held_up(self, node: str) -> bool:
        """A write to the node is in flight, or its next one waits out a pause another writer asked."""
        return node in self.in_flight or node in self.paused

    def resume(self, node: str) -> None:
        """The pause of the node's next write is over (its time ran out, or the writer that asked got in)."""
        self.paused.discard(node)
        self._next_batch(node)

    def _batch_done(self, node: str) -> None:
        self.in_flight.pop(node, None)
        self._next_batch(node)

    async def _write_batch(self, node: str, turns: list[_Turn]) -> None:
        """One compare-and-set with every turn's transition applied in order. A transition that
        raises leaves the value as it found it and gets its own error; a turn whose attempts
        are used up by lost races gets ``Conflict`` while the others go on."""

        def combined(ledger: NodeLedger | None) -> NodeLedger | None:
            value, live = ledger, [t for t in turns if not t.dropped]
            for turn in live:
                try:
                    value, turn.refused = turn.transition(value), None
                except Exception as err:
                    turn.refused = err
            first = next((t.refused for t in live if t.refused is not None), None)
            if first is not None and all(t.refused is not None for t in live):
                raise first  # nothing to write: every caller gets its own error
            return value

        def lost(attempt: int) -> bool:
            for turn in turns:
                if not turn.dropped and turn.attempts <= attempt:
                    turn.dropped = True
                    _answer(turn, Conflict(f"the ledger of {node} kept changing; gave up after {attempt} attempts"))
            return any(not t.dropped for t in turns)

        try:
            written = await self.writes.mutate(node, combined, max(t.attempts for t in turns), lost)
        except BaseException as err:
            self._failed(node, turns, err)
            if not isinstance(err, Exception):
                raise
            return
        for turn in turns:
            if not turn.dropped:
                _answer(turn, turn.refused or written)

    def _failed(self, node: str, turns: list[_Turn], err: BaseException) -> None:
        """Answer a failed batch's turns; those refused for an outage that outlasted a shorter window
        than their own are queued again, at the front."""
        again = []
        for turn in turns:
            if turn.dropped:
                continue
            if isinstance(err, Unavailable) and turn.refused is None and turn.deadline > time.monotonic():
                again.append(turn)  # the outage outlasted a shorter window than this call's
                continue
            _answer(turn, turn.refused if isinstance(err, Exception) and turn.refused is not None else err)
        if again:
            self.queued[node] = again + self.queued.get(node, [])


def _answer(turn: _Turn, result: Written | BaseException) -> None:
    if turn.done.done():
        return
    if isinstance(result, asyncio.CancelledError):
        turn.done.cancel()
    elif isinstance(result, BaseException):
        turn.done.set_exception(result)
    else:
        turn.done.set_result(result)


def _retrieved(done: asyncio.Future[Written]) -> None:
    """An answer nobody waits for any more (the caller's window ended) is not an unhandled error."""
    if not done.cancelled():
        done.exception()
