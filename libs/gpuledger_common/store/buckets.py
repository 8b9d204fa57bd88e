"""The ledger's two JetStream key-value buckets on one NATS connection: their names and keys, how
they are opened (and made, if missing), and the two requests every read and write of them goes
through: riding out a JetStream outage (``outage``) and a publish whose ack comes back to one inbox
of the store's own (``jsacks``).

One ``Buckets`` is shared by the parts of a ``LedgerStore``: it also holds how long each call waits
out an outage (``retry_s``), and what was learned about the buckets when they were opened.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

from nats.aio.client import Client
from nats.js.api import KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, BucketNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from gpuledger_common.store.jsacks import Acks
from gpuledger_common.store.outage import ATTEMPT_S, RETRY_S, OutageStats, outage_of, ride_out
from gpuledger_core.errors import Unavailable
from gpuledger_core.model import Owner

log = logging.getLogger(__name__)
LEDGER_BUCKET = "gpuledger-ledger"
OWNER_BUCKET = "gpuledger-owners"
KEY_PREFIX = f"$KV.{LEDGER_BUCKET}."  # the subject of a ledger key, less the key
T = TypeVar("T")


def node_key(node: str) -> str:
    return f"node.{node}"


def owner_key(owner: Owner) -> str:
    return f"owner.{owner.kind.value}.{hashlib.sha256(owner.key.encode()).hexdigest()[:40]}"


@dataclass(slots=True)
class Buckets:
    nc: Client
    kv: KeyValue
    owners: KeyValue
    retry_s: float = RETRY_S  # how long a call waits out a JetStream outage (``outage.within`` narrows it)
    outage: OutageStats = field(default_factory=OutageStats)
    records_expire: bool = False  # the server drops owner records at their TTL (see ``open_buckets``)
    _jetstream: JetStreamContext | None = None
    _acks: Acks | None = None

    @property
    def js(self) -> JetStreamContext:
        if self._jetstream is None:
            self._jetstream = self.nc.jetstream(timeout=ATTEMPT_S)
        return self._jetstream

    async def ride_out(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, tried again through a JetStream outage until this call's window ends."""
        return await ride_out(self.nc, what, attempt, self.retry_s, self.outage)

    async def stored(self, subject: str, data: bytes, headers: dict[str, str]) -> int:
        """Publish to a bucket's stream; the sequence its ack names (``jsacks``). A conditional
        write the stream refuses is a lost race (``KeyWrongLastSequenceError``, with the
        refusal's words, which may name the revision now)."""
        if self._acks is None:
            self._acks = Acks(self.nc)
        try:
            return await self._acks.publish(subject, data, headers, ATTEMPT_S)
        except APIError as err:
            if err.err_code in (10071, 10164) or "wrong last sequence" in str(err):
                raise KeyWrongLastSequenceError(description=err.description) from err
            raise


async def open_buckets(
    nc: Client, *, replicas: int, retry_s: float, record_ttls: bool, deny_rollups: bool
) -> Buckets:
    """Both buckets (made if missing), each step waited out through an outage (``retry_s``).
    With ``record_ttls`` the owners bucket is made to keep per-message TTLs, and
    ``records_expire`` says whether the server does; with ``deny_rollups`` both streams refuse
    ``Nats-Rollup`` headers (``LedgerStore.open`` says who asks for which)."""
    js = nc.jetstream(timeout=ATTEMPT_S)
    outage = OutageStats()

    async def opened(what: str, work: Callable[[], Awaitable[T]]) -> T:
        return await ride_out(nc, what, work, retry_s, outage)

    kv = await opened(f"open bucket {LEDGER_BUCKET}", lambda: _bucket(js, LEDGER_BUCKET, replicas))
    owners = await opened(f"open bucket {OWNER_BUCKET}", lambda: _bucket(js, OWNER_BUCKET, replicas))
    buckets = Buckets(nc, kv, owners, retry_s=retry_s, outage=outage, _jetstream=js)
    if deny_rollups:
        await opened(f"deny rollups on bucket {LEDGER_BUCKET}", lambda: _deny_rollups(js, LEDGER_BUCKET))
        await opened(f"deny rollups on bucket {OWNER_BUCKET}", lambda: _deny_rollups(js, OWNER_BUCKET))
    if record_ttls:
        buckets.records_expire = await opened("allow per-message TTLs", lambda: _allow_ttl(js, OWNER_BUCKET))
        if not buckets.records_expire:
            log.warning("NATS keeps no per-message TTLs here (2.11+ does): owner records are deleted instead")
    return buckets


async def _bucket(js: JetStreamContext, name: str, replicas: int) -> KeyValue:
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        pass
    except Exception as err:
        _unless_outage(err, f"cannot open bucket {name}")
    config = KeyValueConfig(bucket=name, history=5, storage=StorageType.FILE, replicas=replicas)
    try:
        return await js.create_key_value(config)
    except Exception as err:
        _unless_outage(err, f"cannot create bucket {name}")


async def _allow_ttl(js: JetStreamContext, name: str) -> bool:
    """Let owner records carry a TTL (a bucket made elsewhere may lack per-message TTLs); False
    when the server does not know them (before 2.11 it ignores the setting)."""
    try:
        info = await js.stream_info(f"KV_{name}")
        if not info.config.allow_msg_ttl:
            info.config.allow_msg_ttl = True
            info = await js.update_stream(info.config)
    except Exception as err:
        _unless_outage(err, f"cannot allow per-message TTLs on bucket {name}")
    return bool(info.config.allow_msg_ttl)


async def _deny_rollups(js: JetStreamContext, name: str) -> None:
    """Make the bucket's stream refuse messages with a ``Nats-Rollup`` header (nothing of ours
    purges a key; a rollup of ``all`` on one key empties the bucket)."""
    try:
        info = await js.stream_info(f"KV_{name}")
        if info.config.allow_rollup_hdrs:
            info.config.allow_rollup_hdrs = False
            await js.update_stream(info.config)
    except Exception as err:
        _unless_outage(err, f"cannot deny rollups on bucket {name}")


def _unless_outage(err: Exception, what: str) -> NoReturn:
    """Let an outage through to be ridden out; anything else is ``Unavailable`` at once."""
    if outage_of(err) is not None:
        raise err
    raise Unavailable(f"{what}: {err}") from err
