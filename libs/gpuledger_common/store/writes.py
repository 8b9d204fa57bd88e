"""One change of a node's ledger: read (or start from the known value), apply a pure transition
from ``gpuledger_core.ledger``, and write back only if the key's revision is unchanged.

Lost races are retried a bounded number of times and counted. Only a write can prove a known
value current: a transition that refuses it, or changes nothing, is judged again on a fresh read.
A followed store that keeps losing on a node asks the other writers to yield it (``yielding``).
Every read and write rides out a JetStream outage within the call's window (``cas``, ``outage``).
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.js.errors import APIError, KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError

from gpuledger_common.bus import after_reply
from gpuledger_common.metrics import CAS_ATTEMPTS, CAS_CONFLICTS, CAS_GAVE_UP
from gpuledger_common.store.buckets import KEY_PREFIX, LEDGER_BUCKET, Buckets, node_key
from gpuledger_common.store.cas import MaybeLanded, compare_and_set, pending_at_leader, revision_now
from gpuledger_common.store.events import Events
from gpuledger_common.store.known import Known
from gpuledger_common.store.values import WRITES_REMEMBERED, Values
from gpuledger_common.store.yielding import YIELD_AFTER, YIELD_BACKOFF_S, Yielding
from gpuledger_core import codec
from gpuledger_core.errors import Conflict, GpuledgerError, Unavailable
from gpuledger_core.ledger import NodeLedger, tidy

Transition = Callable[[NodeLedger | None], NodeLedger | None]


@dataclass(slots=True)
class CasStats:
    attempts: int = 0
    conflicts: int = 0
    writes: int = 0
    gave_up: int = 0
    reads: int = 0  # fresh reads of a key that a write needed first


@dataclass(frozen=True, slots=True)
class Written:
    old: NodeLedger | None
    new: NodeLedger | None
    revision: int


@dataclass(slots=True)
class Writes:
    buckets: Buckets
    values: Values
    known: Known
    yielding: Yielding
    events: Events
    max_attempts: int = 12
    clock: Callable[[], float] = time.time
    stats: CasStats = field(default_factory=CasStats)
    written_up_to: int = 0  # the bucket's sequence at this process's latest ledger write (or below it)

    async def read(self, node: str) -> tuple[NodeLedger | None, int]:
        try:
            entry = await self.buckets.ride_out(
                f"read the ledger of {node}", lambda: self.buckets.kv.get(node_key(node))
            )
        except (KeyNotFoundError, KeyDeletedError):
            return None, 0
        except Unavailable:
            raise
        except Exception as err:
            raise Unavailable(f"cannot read the ledger of {node}: {err}") from err
        ledger = self.values.decoded(node, entry.value) if entry.value else None
        self.known.remember(node, ledger, entry.revision or 0)
        return ledger, entry.revision or 0

    async def mutate(
        self, node: str, transition: Transition, attempts: int, lost: Callable[[int], bool] | None = None
    ) -> Written:
        """``lost(attempt)`` hears of each lost race and says whether to go on."""
        lost_to = 0  # the revision that beat our last write, as its refusal named it
        attempt = pending = 0
        while attempt < attempts:
            attempt += 1
            # Only a write can prove a known value current: if the transition refuses it or
            # finds nothing to change, the verdict is taken again on a fresh read.
            known = await self.known.start_from(node, attempt, lost_to)
            tried = _try(transition, known, self.clock()) if known is not None else UNPROVEN
            if known is not None and not isinstance(tried, _Unproven):
                (current, revision), new = known, tried
            else:
                self.stats.reads += 1
                current, revision = await self.read(node)
                new = transition(tidy(current, self.clock()) if current is not None else None)
                if new == current:
                    return Written(current, current, revision)
            if node in self.values.newer:
                codec.check_writable(self.values.newer[node], f"the ledger of {node}")
            self.stats.attempts += 1
            CAS_ATTEMPTS.inc()
            try:
                written = await self._write(node, new, revision)
            except KeyWrongLastSequenceError as refusal:
                self.stats.conflicts += 1
                CAS_CONFLICTS.inc()
                self.known.contended[node] = time.monotonic()
                if isinstance(refusal, MaybeLanded) and (there := await self._there(node, transition)) is not None:
                    return there  # our write, its answer lost: calling the race lost would write it twice
                lost_to = revision_now(refusal)
                if not lost_to and await pending_at_leader(
                    self.buckets, f"write the ledger of {node}", lambda: self._revision(node), revision, pending
                ):
                    attempt, lost_to, pending = attempt - 1, revision, pending + 1  # no race was lost
                    continue
                if attempt == attempts or (lost is not None and not lost(attempt)):
                    break
                await self._back_off(node, attempt)
                continue
            self.stats.writes += 1
            self.written_up_to = max(self.written_up_to, written)
            self.known.remember(node, new, written)
            # The events are not part of the caller's answer: a request handler sends its answer
            # first (``bus.after_reply``); elsewhere they go out as soon as this call returns.
            publish = functools.partial(self.events.start, current, new, written)
            if not after_reply(publish):
                publish()
            return Written(current, new, written)
        if attempts >= self.max_attempts:  # a caller that asked for fewer tries moves on: no give-up
            self.stats.gave_up += 1
            CAS_GAVE_UP.inc()
        raise Conflict(f"the ledger of {node} kept changing; gave up after {attempts} attempts")

    async def _back_off(self, node: str, attempt: int) -> None:
        """The pause after the ``attempt``-th lost race in a row.

        The back-off stays even when the watch brings the winner at once: without it the
        process that just won, which knows its own write first, keeps winning (measured:
        a release gave up after 12 attempts with two replicas and 16 clients). A followed
        store that keeps losing asks the others to hold their next write to the node, and
        so may try again sooner."""
        if self.known.followed and attempt >= YIELD_AFTER:
            await self.yielding.ask(node)
            await asyncio.sleep(random.uniform(0, min(0.2, YIELD_BACKOFF_S * 2 ** (attempt - YIELD_AFTER))))
        else:
            await asyncio.sleep(random.uniform(0, min(0.2, 0.002 * 2**attempt)))

    async def _there(self, node: str, transition: Transition) -> Written | None:
        """After a write whose answer was lost and whose landing cannot be proven: the key read
        afresh, if the transition finds nothing left to do on it (the write is there)."""
        current, revision = await self.read(node)
        new = transition(tidy(current, self.clock()) if current is not None else None)
        return Written(current, current, revision) if new == current else None

    async def _revision(self, node: str) -> int:
        return (await self.read(node))[1]

    async def _write(self, node: str, new: NodeLedger | None, revision: int) -> int:
        key = node_key(node)
        what = f"write the ledger of {node}"
        try:
            if new is None:
                return await self.buckets.ride_out(what, lambda: self._delete(key, revision))
            data = self.values.encoded(new)
            # Noted before the write: its watch entry may arrive before the write's own answer.
            recent = self.values.written.setdefault(node, {})
            recent[data] = new
            while len(recent) > WRITES_REMEMBERED:
                del recent[next(iter(recent))]  # dicts keep insertion order: the oldest goes
            return await compare_and_set(
                self.buckets, what, LEDGER_BUCKET, key, data, revision, lambda: self._put(key, data, revision)
            )
        except (KeyWrongLastSequenceError, Unavailable):
            raise
        except Exception as err:
            raise Unavailable(f"cannot write the ledger of {node}: {err}") from err

    async def _put(self, key: str, data: bytes, revision: int) -> int:
        try:
            if revision == 0:
                return await self.buckets.kv.create(key, data)
            headers = {"Nats-Expected-Last-Subject-Sequence": str(revision)}
            return await self.buckets.stored(f"{KEY_PREFIX}{key}", data, headers)
        except KeyWrongLastSequenceError:
            raise
        except APIError as err:
            if "wrong last sequence" in str(err) or "key exists" in str(err):  # ``create``'s refusals
                raise KeyWrongLastSequenceError(description=err.description) from err
            raise

    async def _delete(self, key: str, revision: int) -> int:
        """Delete a node's key on ``revision``. Tried again after a lost answer, a delete that was
        applied fails as a conflict, and the transition runs again on the deleted key."""
        try:
            await self.buckets.kv.delete(key, last=revision)
        except APIError as err:
            if "wrong last sequence" in str(err):
                raise KeyWrongLastSequenceError() from err
            raise
        return revision + 1


class _Unproven:
    """A transition's verdict on a possibly stale value: to be taken again on a fresh read."""


UNPROVEN = _Unproven()


def _try(transition: Transition, known: tuple[NodeLedger | None, int], now: float) -> NodeLedger | _Unproven | None:
    """The transition's result on a value that may be stale, or ``UNPROVEN`` when it refused or
    changed nothing (neither verdict may be trusted before a fresh read)."""
    current = known[0]
    try:
        new = transition(tidy(current, now) if current is not None else None)
    except GpuledgerError:
        return UNPROVEN
    return UNPROVEN if new == current else new
