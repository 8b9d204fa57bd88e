"""JetStream publishes whose acks come back to one inbox subscription of this process's own.

nats-py's ``JetStreamContext.publish`` waits for an ack through its request machinery: the ack
passes the reply subscription's queue and task, then a done callback and ``asyncio.wait_for``'s
waiter before the caller runs again, and is read into a dataclass. Here the subscription's
callback completes the caller's future, and the ack's JSON is read for the one number the ledger
needs. What a caller hears is what nats-py says: ``NoStreamResponseError`` when no stream
answers, ``nats.errors.TimeoutError`` when the ack does not come in time, and the ``APIError``
that ``APIError.from_error`` picks when the stream refuses.
"""

from __future__ import annotations

import asyncio
import itertools

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, NoStreamResponseError

NO_RESPONDERS = "503"  # the status of the server's own answer when nothing listens on the subject


class Acks:
    """Publish to a stream and wait for its ack; one subscription for every ack (``_INBOX.<id>.*``,
    under the connection's inbox prefix)."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self._prefix = ""
        self._sub: Subscription | None = None
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._tokens = itertools.count(1)
        self._starting = asyncio.Lock()

    async def publish(self, subject: str, data: bytes, headers: dict[str, str], timeout: float) -> int:
        """Publish ``data`` on ``subject`` and return the stream sequence its ack names."""
        if self._sub is None:
            await self._start()
        token = str(next(self._tokens))
        answer: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._waiting[token] = answer
        try:
            await self.nc.publish(subject, data, reply=f"{self._prefix}.{token}", headers=headers)
            try:
                async with asyncio.timeout(timeout):
                    msg = await answer
            except TimeoutError:
                raise NatsTimeout from None
        finally:
            del self._waiting[token]
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            raise NoStreamResponseError
        ack = orjson.loads(msg.data)
        if "error" in ack:
            APIError.from_error(ack["error"])  # raises
        return int(ack["seq"])

    async def _start(self) -> None:
        async with self._starting:
            if self._sub is None:
                prefix = self.nc.new_inbox()
                self._sub = await self.nc.subscribe(f"{prefix}.*", cb=self._on_ack)
                self._prefix = prefix

    async def _on_ack(self, msg: Msg) -> None:
        answer = self._waiting.get(msg.subject.rpartition(".")[2])
        if answer is not None and not answer.done():
            answer.set_result(msg)
