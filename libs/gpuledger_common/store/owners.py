"""The owner index: one allocation per owner, whichever replica got there first.

A record per owner in its own bucket (``owner.<kind>.<hash of the owner's key>``) names the
allocation it holds and the node that allocation is on. A new record is a compare-and-set on
revision 0 (or on the marker that deleted the last one), a change or a delete is one on the
revision read, so two replicas never both think they hold an owner's allocation. The allocator's
records may carry a TTL that the server keeps (nats-server 2.11+).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError

from gpuledger_common.bus import encode
from gpuledger_common.store.buckets import OWNER_BUCKET, Buckets, owner_key
from gpuledger_common.store.cas import compare_and_set, pending_at_leader, revision_now
from gpuledger_common.store.outage import within
from gpuledger_common.store.values import parsed
from gpuledger_core.errors import InvalidArgument, Unavailable
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.model import Owner


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """Which allocation an owner holds, as the owner index says; ``at`` is the writer's clock."""

    allocation: AllocationId
    node: NodeName
    revision: int
    at: float


@dataclass(slots=True)
class OwnerIndex:
    buckets: Buckets
    clock: Callable[[], float] = time.time

    async def owner_of(self, owner: Owner) -> tuple[AllocationId, NodeName, int] | None:
        record = await self.record(owner)
        return None if record is None else (record.allocation, record.node, record.revision)

    async def record(self, owner: Owner) -> OwnerRecord | None:
        try:
            key = owner_key(owner)
            entry = await self.buckets.ride_out("read the owner index", lambda: self.buckets.owners.get(key))
        except (KeyNotFoundError, KeyDeletedError):
            return None
        except Unavailable:
            raise
        except Exception as err:
            raise Unavailable(f"cannot read the owner index: {err}") from err
        if not entry.value:
            return None
        raw = parsed(entry.value, "owner record")
        if not isinstance(raw, dict):
            return None
        if not (isinstance(raw.get("allocation"), str) and isinstance(raw.get("node"), str)):
            raise InvalidArgument("owner record", "needs the allocation and node it names")
        at = raw.get("at")
        return OwnerRecord(
            AllocationId(raw["allocation"]),
            NodeName(raw["node"]),
            entry.revision or 0,
            float(at) if isinstance(at, (int, float)) else 0.0,
        )

    async def claim(
        self, owner: Owner, allocation: AllocationId, node: str, revision: int = 0, ttl_s: float | None = None
    ) -> int | None:
        """Record ``allocation`` as the owner's: a new record (``revision`` 0) or a change of the
        record at ``revision``; with ``ttl_s`` the server drops the record after that long.
        Returns the record's new revision, or None if someone else's record is in the way."""
        key = owner_key(owner)
        data = encode({"allocation": allocation, "node": node, "owner": owner.key, "at": self.clock()})
        with within(self.buckets.retry_s):
            return await self._claim(key, data, revision, ttl_s)

    async def _claim(self, key: str, data: bytes, revision: int, ttl_s: float | None) -> int | None:
        try:
            try:
                return await self._put(key, data, revision, ttl_s)
            except KeyWrongLastSequenceError:
                if revision:
                    return None
                # A new record where an old one was deleted: the delete marker is the last revision.
                try:
                    await self.buckets.ride_out("read the owner index", lambda: self.buckets.owners.get(key))
                except (KeyNotFoundError, KeyDeletedError) as gone:  # deleted (it has an entry), or expired
                    entry = getattr(gone, "entry", None)
                    return await self._put(key, data, (entry.revision or 0) if entry else 0, ttl_s)
                return None
        except KeyWrongLastSequenceError:
            return None
        except Unavailable:
            raise
        except Exception as err:
            raise Unavailable(f"cannot write the owner index: {err}") from err

    async def _put(self, key: str, data: bytes, revision: int, ttl_s: float | None) -> int:
        """Write the owner's record on ``revision``. A refusal that names no revision, with the
        record still at ``revision``, lost no race: it is waited out (``cas.pending_at_leader``)."""
        subject = f"$KV.{OWNER_BUCKET}.{key}"
        headers = {"Nats-Expected-Last-Subject-Sequence": str(revision)}

        async def put() -> int:
            return await self.buckets.stored(subject, data, {**headers, **_ttl(ttl_s)})

        waited = 0
        what = "write the owner index"
        while True:
            try:
                return await compare_and_set(self.buckets, what, OWNER_BUCKET, key, data, revision, put)
            except KeyWrongLastSequenceError as refusal:
                if revision_now(refusal) or not await pending_at_leader(
                    self.buckets, what, lambda: self._revision(key), revision, waited
                ):
                    raise
                waited += 1

    async def _revision(self, key: str) -> int:
        """The owner record's revision: of its last write, or of the marker that deleted it; 0 if none."""
        try:
            entry = await self.buckets.ride_out("read the owner index", lambda: self.buckets.owners.get(key))
        except (KeyNotFoundError, KeyDeletedError) as gone:
            found = getattr(gone, "entry", None)
            return (found.revision or 0) if found is not None else 0
        return entry.revision or 0

    async def forget_owner_of(self, owner: Owner, allocation_id: AllocationId) -> None:
        """Drop the owner's record if it still names ``allocation_id`` (so the owner may
        allocate anew once that allocation is released)."""
        record = await self.owner_of(owner)
        if record is not None and record[0] == allocation_id:
            await self.forget(owner, record[2])

    async def forget(self, owner: Owner, revision: int) -> None:
        """Drop the owner's record if it is still the one read at ``revision`` (tried again after
        a lost answer, a delete that was applied fails as a conflict: the record is gone)."""
        try:
            await self.buckets.ride_out(
                "write the owner index", lambda: self.buckets.owners.delete(owner_key(owner), last=revision)
            )
        except KeyWrongLastSequenceError:
            pass
        except Unavailable:
            raise
        except Exception as err:
            if "wrong last sequence" not in str(err):
                raise Unavailable(f"cannot write the owner index: {err}") from err


def _ttl(ttl_s: float | None) -> dict[str, str]:
    """The header that gives a message its own TTL, in whole seconds (as nats-py writes it)."""
    return {} if ttl_s is None else {"Nats-TTL": str(int(ttl_s))}
