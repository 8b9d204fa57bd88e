"""A compare-and-set of a bucket's key that rides out a JetStream outage and is applied at most once.

A put whose answer was lost (a timeout, a dropped connection) may have been applied: tried again
with the same bytes on the same revision, it then fails as a conflict, and the key's first message
after that revision (the write that took its place) says whether it was this one. When it does not
prove it (the bucket keeps a few messages of a key, so later writes may have pushed it out), the
conflict is ``MaybeLanded``: the writer must look at the key before it calls the race lost. A refusal that
names no revision while the key stands still lost no race: the stream's leader holds a write it
has not committed yet, and that is waited out within the call's window (docs/ledger.md).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from gpuledger_common.store.buckets import Buckets
from gpuledger_common.store.outage import MAX_BACKOFF_S, Outage, outage_of, time_left
from gpuledger_core.errors import Unavailable


class MaybeLanded(KeyWrongLastSequenceError):
    """A conflict after a put whose answer was lost, where the put may be what took the revision:
    the key's message that would say so is no longer kept (or was another's)."""


PENDING_PAUSE_S = 0.005  # the first pause after a refusal that a write pending at the leader caused


async def compare_and_set(
    buckets: Buckets,
    what: str,
    bucket: str,
    key: str,
    data: bytes,
    revision: int,
    put: Callable[[], Awaitable[int]],
) -> int:
    """``put()``, a compare-and-set of ``data`` on ``revision``, ridden out; its new revision.
    A put whose answer was lost (a timeout, a dropped connection) may have been applied:
    tried again, it then fails as a conflict, and the key's first message after
    ``revision`` (the write that took its place) says whether it was this one."""
    unsure = False

    async def attempt() -> int:
        nonlocal unsure
        try:
            return await put()
        except KeyWrongLastSequenceError as refusal:
            if not unsure:
                raise
            if landed := await _landed(buckets, bucket, key, revision, data):
                return landed
            raise MaybeLanded(description=refusal.description) from refusal
        except Exception as err:
            unsure = unsure or outage_of(err) is Outage.UNKNOWN
            raise
        except asyncio.CancelledError:  # cut off at the end of the window: it may have been applied
            unsure = True
            raise

    return await buckets.ride_out(what, attempt)


async def _landed(buckets: Buckets, bucket: str, key: str, revision: int, data: bytes) -> int:
    """The revision ``data`` was written at on top of ``revision``, or 0 if that is not proven:
    another write took that place, or the message is no longer kept and a later one is the
    first the key has after ``revision``."""
    try:
        msg = await buckets.js.get_msg(f"KV_{bucket}", seq=revision + 1, subject=f"$KV.{bucket}.{key}", next=True)
    except NotFoundError:
        return 0
    return (msg.seq or 0) if msg.data == data else 0


async def pending_at_leader(
    buckets: Buckets, what: str, revision_now: Callable[[], Awaitable[int]], revision: int, waited: int
) -> bool:
    """After a refusal that names no revision ("wrong last sequence"): True, after a pause, when
    the key is still at ``revision`` (``revision_now()`` reads it). Then no other write won:
    the stream's leader holds a write to the key that it has not committed yet (another
    writer's, still being replicated), or cannot commit (a leader that lost its quorum refuses
    every later conditional write to the key until it steps down). That is waited out within
    the call's window, as an outage is, and refused as ``Unavailable`` once the window is over."""
    if await revision_now() != revision:
        return False
    pause = random.uniform(0.5, 1.0) * min(MAX_BACKOFF_S, PENDING_PAUSE_S * 2**waited)
    if time_left(buckets.retry_s) <= pause:
        raise Unavailable(
            f"cannot {what}: the stream's leader holds an earlier write to it that it "
            "cannot commit (has the JetStream cluster lost its quorum?)"
        )
    await asyncio.sleep(pause)
    return True


def revision_now(lost: KeyWrongLastSequenceError) -> int:
    """The key's revision as the refusal of a compare-and-set names it ("wrong last sequence: 7"),
    or 0 when it does not."""
    found = re.search(r"wrong last sequence: (\d+)", str(getattr(lost, "description", "") or ""))
    return int(found.group(1)) if found else 0
