"""The ledger in a JetStream key-value bucket: one key per node, every change a compare-and-set.

Any number of allocator, placement or plugin processes may write; each write reads the node's
key, applies a pure transition from ``gpuledger_core.ledger`` and writes back only if the key's
revision is unchanged. Lost races are retried a bounded number of times and counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.js.api import KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from gpuledger_core import codec
from gpuledger_core.errors import Conflict, Unavailable
from gpuledger_core.events import LedgerEvent, diff
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger, tidy
from gpuledger_core.model import Owner
from gpuledger_common.bus import SUBJECT_PREFIX, encode
from gpuledger_common.metrics import CAS_ATTEMPTS, CAS_CONFLICTS, CAS_GAVE_UP

log = logging.getLogger(__name__)

LEDGER_BUCKET = "gpuledger-ledger"
OWNER_BUCKET = "gpuledger-owners"
EVENTS_SUBJECT = f"{SUBJECT_PREFIX}.events"
Transition = Callable[[NodeLedger | None], NodeLedger | None]


def node_key(node: str) -> str:
    return f"node.{node}"


def owner_key(owner: Owner) -> str:
    return f"owner.{owner.kind.value}.{hashlib.sha256(owner.key.encode()).hexdigest()[:40]}"


@dataclass(slots=True)
class CasStats:
    attempts: int = 0
    conflicts: int = 0
    writes: int = 0
    gave_up: int = 0


@dataclass(frozen=True, slots=True)
class Written:
    old: NodeLedger | None
    new: NodeLedger | None
    revision: int
    events: tuple[LedgerEvent, ...] = ()


@dataclass(slots=True)
class LedgerStore:
    nc: Client
    kv: KeyValue
    owners: KeyValue
    max_attempts: int = 12
    clock: Callable[[], float] = time.time
    stats: CasStats = field(default_factory=CasStats)

    @classmethod
    async def open(cls, nc: Client, *, replicas: int = 1, max_attempts: int = 12) -> LedgerStore:
        js = nc.jetstream()
        kv = await _bucket(js, LEDGER_BUCKET, replicas)
        owners = await _bucket(js, OWNER_BUCKET, replicas)
        return cls(nc, kv, owners, max_attempts)

    async def read(self, node: str) -> tuple[NodeLedger | None, int]:
        try:
            entry = await self.kv.get(node_key(node))
        except (KeyNotFoundError, KeyDeletedError):
            return None, 0
        except Exception as err:
            raise Unavailable(f"cannot read the ledger of {node}: {err}") from err
        if entry.value is None:
            return None, entry.revision or 0
        return codec.ledger_from(_json(entry.value)), entry.revision or 0

    async def mutate(self, node: str, transition: Transition) -> Written:
        """Apply ``transition`` to the node's current ledger with compare-and-set.

        The transition sees the ledger after expired leases and old releases are tidied away,
        and may raise (nothing is written then). Returns what was written, or the unchanged
        state when the transition changed nothing.
        """
        for attempt in range(1, self.max_attempts + 1):
            current, revision = await self.read(node)
            now = self.clock()
            base = tidy(current, now) if current is not None else None
            new = transition(base)
            if new == current:
                return Written(current, current, revision)
            self.stats.attempts += 1
            CAS_ATTEMPTS.inc()
            try:
                written = await self._write(node, new, revision)
            except KeyWrongLastSequenceError:
                self.stats.conflicts += 1
                CAS_CONFLICTS.inc()
                await asyncio.sleep(random.uniform(0, 0.002 * attempt))
                continue
            self.stats.writes += 1
            events = diff(current, new, written)
            await self._publish(events)
            return Written(current, new, written, events)
        self.stats.gave_up += 1
        CAS_GAVE_UP.inc()
        raise Conflict(f"the ledger of {node} kept changing; gave up after {self.max_attempts} attempts")

    async def _write(self, node: str, new: NodeLedger | None, revision: int) -> int:
        key = node_key(node)
        try:
            if new is None:
                await self.kv.delete(key, last=revision)
                return revision + 1
            data = encode(codec.ledger_to(new))
            if revision == 0:
                return await self.kv.create(key, data)
            return await self.kv.update(key, data, last=revision)
        except KeyWrongLastSequenceError:
            raise
        except Exception as err:
            if "wrong last sequence" in str(err) or "key exists" in str(err):
                raise KeyWrongLastSequenceError() from err
            raise Unavailable(f"cannot write the ledger of {node}: {err}") from err

    async def _publish(self, events: tuple[LedgerEvent, ...]) -> None:
        for event in events:
            try:
                subject = f"{EVENTS_SUBJECT}.{event.node}"
                await self.nc.publish(subject, encode(codec.event_to(event)))
            except Exception as err:  # the write stands; watchers also see the key change
                log.warning("could not publish %s event for %s: %s", event.kind, event.node, err)

    async def nodes(self) -> dict[NodeName, tuple[NodeLedger, int]]:
        """Every node's ledger as it is now."""
        found: dict[NodeName, tuple[NodeLedger, int]] = {}
        async for node, ledger, revision in self.watch(include_updates=False):
            if ledger is not None:
                found[node] = (ledger, revision)
        return found

    async def watch(
        self, include_updates: bool = True, caught_up: Callable[[], None] | None = None
    ) -> AsyncIterator[tuple[NodeName, NodeLedger | None, int]]:
        """Every node's current ledger, then (with ``include_updates``) every change.

        ``caught_up`` is called once the current values have all been yielded.
        """
        try:
            watcher = await self.kv.watch("node.>")
        except Exception as err:
            raise Unavailable(f"cannot watch the ledger: {err}") from err
        try:
            async for entry in watcher:
                if entry is None:  # end of the initial values
                    if caught_up is not None:
                        caught_up()
                    if not include_updates:
                        return
                    continue
                node = NodeName(entry.key.removeprefix("node."))
                deleted = entry.operation in ("DEL", "PURGE") or not entry.value
                ledger = None if deleted else codec.ledger_from(_json(entry.value))
                yield node, ledger, entry.revision or 0
        finally:
            await watcher.stop()

    # --- the owner index: one allocation per owner, whichever replica got there first ---

    async def owner_of(self, owner: Owner) -> tuple[AllocationId, NodeName, int] | None:
        try:
            entry = await self.owners.get(owner_key(owner))
        except (KeyNotFoundError, KeyDeletedError):
            return None
        except Exception as err:
            raise Unavailable(f"cannot read the owner index: {err}") from err
        if not entry.value:
            return None
        raw = _json(entry.value)
        return AllocationId(raw["allocation"]), NodeName(raw["node"]), entry.revision or 0

    async def claim_owner(self, owner: Owner, allocation: AllocationId, node: str) -> bool:
        """Record ``allocation`` as the owner's; False if the owner already has a record."""
        data = encode({"allocation": allocation, "node": node, "owner": owner.key})
        try:
            await self.owners.create(owner_key(owner), data)
        except KeyWrongLastSequenceError:
            return False
        except Exception as err:
            if "wrong last sequence" in str(err) or "key exists" in str(err):
                return False
            raise Unavailable(f"cannot write the owner index: {err}") from err
        return True

    async def forget_owner(self, owner: Owner, revision: int) -> None:
        """Drop the owner's record if it is still the one read at ``revision``."""
        try:
            await self.owners.delete(owner_key(owner), last=revision)
        except KeyWrongLastSequenceError:
            pass
        except Exception as err:
            if "wrong last sequence" not in str(err):
                raise Unavailable(f"cannot write the owner index: {err}") from err


async def _bucket(js: JetStreamContext, name: str, replicas: int) -> KeyValue:
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        pass
    except Exception as err:
        raise Unavailable(f"cannot open bucket {name}: {err}") from err
    config = KeyValueConfig(bucket=name, history=5, storage=StorageType.FILE, replicas=replicas)
    try:
        return await js.create_key_value(config)
    except Exception as err:
        raise Unavailable(f"cannot create bucket {name}: {err}") from err


def _json(data: bytes) -> object:
    return json.loads(data)
