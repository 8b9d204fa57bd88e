"""A TCP forwarder on loopback in front of a server, either direction of which can be held (its
bytes kept back, not forwarded) and released: a request that reaches the server late, or whose
answer is lost for longer than the client waits, as when a JetStream leader fails mid-write."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass
class HeldLink:
    target_port: int
    port: int = 0
    _to_server: asyncio.Event = field(default_factory=asyncio.Event)
    _to_client: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> HeldLink:
        self._to_server.set()
        self._to_client.set()
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def hold_requests(self) -> None:
        """What clients send stays here until ``release``."""
        self._to_server.clear()

    def hold_answers(self) -> None:
        """What the server sends stays here until ``release``."""
        self._to_client.clear()

    def release(self) -> None:
        self._to_server.set()
        self._to_client.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        pumps = (
            asyncio.create_task(_copy(reader, upstream, self._to_server)),
            asyncio.create_task(_copy(upstream_reader, writer, self._to_client)),
        )
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
                self._tasks.discard(pump)
            for end in (writer, upstream):
                end.close()


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter, flowing: asyncio.Event) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await source.read(CHUNK):
            await flowing.wait()
            sink.write(data)
            await sink.drain()
