"""A watch of ledger keys that this process checks itself.

A JetStream consumer lives on one server. When that server dies while this client's connection
lives on another, nothing reaches the client: no value, no error. Here the server is asked for a
heartbeat every ``HEARTBEAT_S`` while it has nothing to deliver, and the watch is over
(``failed``) once neither a value nor a heartbeat came for ``MISSED_S``, or the consumer's
sequence skipped a value; whoever follows it then starts again from a fresh snapshot
(``gpuledger_common.store.follow``). nats-py's ordered consumer notices the same only after two missed
heartbeats of 5 s, and then makes the consumer again in a task of its own, beside the
subscription it keeps; here nothing runs but the subscription and one checking task, both ended
by ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

log = logging.getLogger(__name__)
HEARTBEAT_S = 1.0  # the server's heartbeat while there is nothing to deliver
MISSED_S = 2.5  # no value and no heartbeat this long: the consumer is gone
INACTIVE_S = 300.0  # the server drops a consumer nobody has listened to this long
STOP_S = 1.0  # how long stopping waits for the server to drop the consumer
STATUS = "Status"
LAST_CONSUMER = "Nats-Last-Consumer"
STALLED = "Nats-Consumer-Stalled"


class WatchLost(Exception):
    """The watch missed values, or heard nothing from its consumer for too long."""


@dataclass(slots=True)
class KeyWatch:
    """Every message of ``subject`` in ``stream``, the last of each key first, then every new one,
    handed to ``deliver`` in order from the subscription's own callback."""

    nc: Client
    js: JetStreamContext
    stream: str
    subject: str
    deliver: Callable[[Msg], None]
    lost: Callable[[], None] = lambda: None  # called once, when ``failed`` is set
    heartbeat_s: float = HEARTBEAT_S
    missed_s: float = MISSED_S
    failed: Exception | None = None
    _delivered: int = 0  # the consumer's sequence of the last value handed on
    _heard: float = 0.0  # when the consumer was last heard from (loop time)
    _sub: Subscription | None = None
    _consumer: str = ""
    _checking: asyncio.Task[None] | None = None

    async def start(self) -> KeyWatch:
        """Subscribe, then make the consumer; raises what the server answered if it could not."""
        loop = asyncio.get_running_loop()
        inbox = self.nc.new_inbox()
        self._heard = loop.time()
        self._sub = await self.nc.subscribe(inbox, cb=self._on_msg)
        config = ConsumerConfig(
            deliver_subject=inbox,
            filter_subject=self.subject,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=self.heartbeat_s,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=INACTIVE_S,
        )
        try:
            info = await self.js.add_consumer(self.stream, config)
        except BaseException:
            await self.stop()
            raise
        self._consumer = info.name
        self._heard = loop.time()
        self._checking = loop.create_task(self._check())
        return self

    async def stop(self) -> None:
        """End the subscription and the check, and ask the server to drop the consumer."""
        if self._checking is not None:
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checking
            self._checking = None
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        if self._consumer and self.nc.is_connected:
            with contextlib.suppress(Exception):  # gone with its server, or dropped later as inactive
                async with asyncio.timeout(STOP_S):
                    await self.js.delete_consumer(self.stream, self._consumer)
        self._consumer = ""

    def _fail(self, err: Exception) -> None:
        if self.failed is None:
            self.failed = err
            self.lost()

    async def _check(self) -> None:
        loop = asyncio.get_running_loop()
        while self.failed is None:
            await asyncio.sleep(self.heartbeat_s / 2)
            silent = loop.time() - self._heard
            if silent > self.missed_s:
                self._fail(WatchLost(f"nothing from its consumer for {silent:.1f}s (its server gone?)"))

    async def _on_msg(self, msg: Msg) -> None:
        if self.failed is not None:
            return
        self._heard = asyncio.get_running_loop().time()
        headers = msg.headers or {}
        if headers.get(STATUS) == "100":  # a heartbeat, or a flow control request
            await self._control(msg, headers)
            return
        sequence = msg.metadata.sequence.consumer
        if sequence != self._delivered + 1:
            self._fail(WatchLost(f"its consumer skipped from value {self._delivered} to {sequence}"))
            return
        self._delivered = sequence
        try:
            self.deliver(msg)
        except Exception as err:  # a value that cannot be taken: the follower starts again
            self._fail(err)

    async def _control(self, msg: Msg, headers: dict[str, str]) -> None:
        last = headers.get(LAST_CONSUMER)
        if last is not None and last.isdigit() and int(last) != self._delivered:
            self._fail(WatchLost(f"its consumer delivered {last} values, {self._delivered} arrived"))
            return
        for reply in (msg.reply, headers.get(STALLED)):
            if reply:  # the server waits for an empty answer before it delivers more
                with contextlib.suppress(Exception):  # the connection is going: so is the watch
                    await self.nc.publish(reply)
