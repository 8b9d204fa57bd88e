"""The extender's HTTPS port: HTTP/2 for a client that offers ``h2`` (kube-scheduler), HTTP/1.1 else.

kube-scheduler's extender client is Go's net/http configured for HTTP/2. Over HTTP/1.1 it keeps at
most two idle connections per host, so while a burst of binds is in flight nearly every second
pod opened a new connection: a TLS handshake with the client certificate verified, about 2 ms of
placement's CPU (OpenSSL 3.0) and more of kube-scheduler's. Over HTTP/2 every call shares one
connection. The choice is made by ALPN in the handshake (``tls.EXTENDER_ALPN`` offers ``h2``
first); a connection that chose ``http/1.1`` (or no ALPN) is handed to aiohttp with the same verbs.

Each request is one stream: ``POST`` to a verb's path, its body answered by the verb (``Verb``: a
function of the body and the caller's identity, ``routes.Extender.verbs``) with status, content
type and body, as over HTTP/1.1. The caller's identity is its client certificate's common name,
read once per connection; a caller not let in gets 403 for every request. A body over ``max_body_bytes`` gets
413. As aiohttp does, a call whose client went away (a reset stream, a lost connection) runs to
its end, its answer dropped: a bind is never cut off between its ledger write and its Binding.
Nothing here knows the verbs' meaning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from aiohttp import web
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes

from gpuledger_common.tls import identity_of
from gpuledger_placement import metrics

log = logging.getLogger(__name__)
MAX_STREAMS = 256  # calls in flight on one connection (kube-scheduler's binds run concurrently)
CLOSE_WAIT_S = 5.0  # how long closing waits for the calls in flight before cancelling them
Verb = Callable[[bytes, str], Awaitable[web.Response]]  # the body, the caller's identity
Gate = Callable[[str], web.Response | None]  # the answer for a caller not let in (None: let in)


@dataclass(slots=True)
class _Stream:
    method: str
    path: str
    body: bytearray = field(default_factory=bytearray)


class Http2(asyncio.Protocol):
    """One HTTP/2 connection (after the TLS handshake chose ``h2``)."""

    def __init__(
        self,
        verbs: Mapping[str, Verb],
        gate: Gate,
        max_body_bytes: int,
        spawn: Callable[[Awaitable[None]], None],
        lost: Callable[[Http2], None],
    ) -> None:
        self._verbs, self._gate, self._max_body = verbs, gate, max_body_bytes
        self._spawn, self._lost = spawn, lost  # the server runs the calls and keeps the connections
        self._h2 = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        self._streams: dict[int, _Stream] = {}
        self._window_open = asyncio.Event()
        self._transport: asyncio.Transport | None = None
        self._caller = ""
        self._flushing = False  # a write of what h2 has to send is due at the loop's next turn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's TLS transport is not a subclass
        self._caller = identity_of(transport.get_extra_info("peercert"))
        self._h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS})
        self._h2.initiate_connection()
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except ProtocolError as err:
            log.warning("extender: HTTP/2 protocol error from %r (%s); closing the connection", self._caller, err)
            self._flush()
            self.close()
            return
        for event in events:
            self._on(event)
        self._flush_soon()

    def _on(self, event: object) -> None:
        if isinstance(event, RequestReceived):
            headers = {_text(name): _text(value) for name, value in event.headers or []}
            self._streams[event.stream_id] = _Stream(headers.get(":method", ""), headers.get(":path", ""))
        elif isinstance(event, DataReceived):
            self._received(event.stream_id, event.data or b"", event.flow_controlled_length or 0)
        elif isinstance(event, StreamEnded):  # a request without body ends with its headers: this follows them
            self._answer(event.stream_id)
        elif isinstance(event, StreamReset):
            self._streams.pop(event.stream_id, None)  # a call running for it finishes, unanswered
        elif isinstance(event, WindowUpdated):
            self._window_open.set()
        elif isinstance(event, ConnectionTerminated):
            self.close()

    def _received(self, stream_id: int, data: bytes, counted: int) -> None:
        with contextlib.suppress(StreamClosedError, ProtocolError):
            self._h2.acknowledge_received_data(counted, stream_id)
        stream = self._streams.get(stream_id)
        if stream is None:  # answered already (too large), or reset: the rest is dropped
            return
        stream.body += data
        if len(stream.body) > self._max_body:
            del self._streams[stream_id]
            self._spawn(self._send(stream_id, _too_large(self._max_body), cancel_request=True))

    def _answer(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._spawn(self._call(stream_id, stream))

    async def _call(self, stream_id: int, stream: _Stream) -> None:
        verb = self._verbs.get(stream.path)
        if verb is None:
            response = web.Response(status=404, text="404: Not Found")
        elif stream.method != "POST":
            response = web.Response(status=405, text="405: Method Not Allowed")
        else:
            refused = self._gate(self._caller)
            response = refused if refused is not None else await _answered(verb, bytes(stream.body), self._caller)
        await self._send(stream_id, response)

    async def _send(self, stream_id: int, response: web.Response, cancel_request: bool = False) -> None:
        if self._transport is None:  # the connection is gone: nobody to answer
            return
        body = response.body
        if not isinstance(body, (bytes, bytearray)):  # every verb answers bytes (or text, which aiohttp encodes)
            raise TypeError(f"an extender verb answered a body of {type(body).__name__}, not bytes")
        headers = [
            (":status", str(response.status)),
            ("content-type", response.headers.get("Content-Type") or response.content_type),
            ("content-length", str(len(body))),
        ]
        try:
            self._h2.send_headers(stream_id, headers, end_stream=not body)
            while body:
                if self._transport is None:
                    return
                window = min(self._h2.local_flow_control_window(stream_id), self._h2.max_outbound_frame_size)
                if window <= 0:
                    self._flush()
                    self._window_open.clear()
                    await self._window_open.wait()
                    continue
                chunk, body = bytes(body[:window]), body[window:]
                self._h2.send_data(stream_id, chunk, end_stream=not body)
            if cancel_request:  # the answer came before the whole request: stop its sender
                self._h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)
        except (StreamClosedError, ProtocolError):  # the client gave up on the stream
            return
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Write what h2 has to send once the calls that end in this turn of the loop have all
        answered: one TLS record and one write for all of them (a burst's binds end together)."""
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        data = self._h2.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        """Say goodbye (GOAWAY) and close."""
        if self._transport is None or self._transport.is_closing():
            return
        with contextlib.suppress(ProtocolError):
            self._h2.close_connection()
        self._flush()
        self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._streams.clear()
        self._window_open.set()  # a call waiting to send sees the connection gone
        self._lost(self)


async def _answered(verb: Verb, body: bytes, caller: str) -> web.Response:
    try:
        return await verb(body, caller)
    except asyncio.CancelledError:
        raise
    except Exception:  # as aiohttp answers a handler that raised
        log.exception("extender: a verb raised")
        return web.Response(status=500, text="500: Internal Server Error")


def _text(header: bytes | str) -> str:
    """A header's name or value (h2 decodes them with ``header_encoding``; its types say bytes)."""
    return header.decode() if isinstance(header, bytes) else header


def _too_large(limit: int) -> web.Response:
    return web.Response(status=413, text=f"request body larger than {limit} bytes\n")


class Switch(asyncio.Protocol):
    """Hands a connection, once its handshake is done, to HTTP/2 or to aiohttp's HTTP/1.1."""

    def __init__(self, server: ExtenderServer) -> None:
        self._server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tls = transport.get_extra_info("ssl_object")
        chosen = tls.selected_alpn_protocol() if isinstance(tls, (ssl.SSLObject, ssl.SSLSocket)) else None
        protocol = self._server.protocol_for(chosen)
        metrics.EXTENDER_CONNECTIONS.labels("h2" if isinstance(protocol, Http2) else "http/1.1").inc()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    def data_received(self, data: bytes) -> None:  # never: the connection was handed on
        raise RuntimeError("the extender's connection switch received data")


class ExtenderServer:
    """The extender's verbs on one TLS port, over HTTP/2 and HTTP/1.1 (``app``, the same verbs
    as aiohttp routes, with their middlewares)."""

    def __init__(
        self, app: web.Application, verbs: Mapping[str, Verb], gate: Gate, max_body_bytes: int, **kwargs: Any
    ) -> None:
        self._runner = web.AppRunner(app, access_log=None, **kwargs)
        self._verbs, self._gate, self._max_body = verbs, gate, max_body_bytes
        self._connections: set[Http2] = set()
        self._calls: set[asyncio.Task[None]] = set()
        self._listening: asyncio.Server | None = None

    async def start(self, host: str, port: int, tls: ssl.SSLContext) -> None:
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        self._listening = await loop.create_server(lambda: Switch(self), host, port, ssl=tls)

    def protocol_for(self, alpn: str | None) -> asyncio.BaseProtocol:
        if alpn != "h2":
            http1 = self._runner.server
            assert http1 is not None, "start() first"
            return http1()
        connection = Http2(self._verbs, self._gate, self._max_body, self._spawn, self._connections.discard)
        self._connections.add(connection)
        return connection

    def _spawn(self, call: Awaitable[None]) -> None:
        task = asyncio.ensure_future(call)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    @property
    def port(self) -> int:
        assert self._listening is not None and self._listening.sockets, "not listening"
        port: int = self._listening.sockets[0].getsockname()[1]
        return port

    async def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop listening, let the HTTP/2 calls in flight finish (``wait_s`` at most, then cancel
        them), close every HTTP/2 connection, shut aiohttp's down."""
        if self._listening is not None:
            self._listening.close()
        if self._calls:
            _, late = await asyncio.wait(set(self._calls), timeout=wait_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for connection in list(self._connections):
            connection.close()
        await self._runner.shutdown()
        await self._runner.cleanup()
