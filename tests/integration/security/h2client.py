"""A small HTTP/2 client for the extender tests: every request on one TLS connection (ALPN ``h2``,
as kube-scheduler's Go client offers it), sent at once as concurrent streams."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, ResponseReceived, StreamEnded, StreamReset


@dataclass
class Answer:
    status: int = 0
    body: bytearray = field(default_factory=bytearray)
    reset: bool = False


async def h2_calls(
    host: str, port: int, tls: ssl.SSLContext, calls: list[tuple[str, str, bytes]]
) -> tuple[str | None, list[Answer]]:
    """(method, path, body) each on its own stream of one connection: the protocol ALPN chose,
    and each answer in the order asked."""
    tls.set_alpn_protocols(["h2", "http/1.1"])
    reader, writer = await asyncio.open_connection(host, port, ssl=tls)
    chosen = writer.get_extra_info("ssl_object").selected_alpn_protocol()
    h2 = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    h2.initiate_connection()
    answers: dict[int, Answer] = {}
    for method, path, body in calls:
        stream_id = h2.get_next_available_stream_id()
        answers[stream_id] = Answer()
        headers = [(":method", method), (":path", path), (":scheme", "https"), (":authority", f"{host}:{port}")]
        h2.send_headers(stream_id, [*headers, ("content-length", str(len(body)))], end_stream=not body)
        size = h2.max_outbound_frame_size
        for start in range(0, len(body), size):  # the bodies sent here fit the first window
            h2.send_data(stream_id, body[start : start + size], end_stream=start + size >= len(body))
    writer.write(h2.data_to_send())
    ended: set[int] = set()
    try:
        while len(ended) < len(answers):
            data = await reader.read(65536)
            if not data:
                break
            for event in h2.receive_data(data):
                if isinstance(event, ResponseReceived):
                    status = next(value for name, value in event.headers or [] if name in (":status", b":status"))
                    answers[event.stream_id].status = int(status)
                elif isinstance(event, DataReceived):
                    answers[event.stream_id].body += event.data
                    h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, StreamEnded):
                    ended.add(event.stream_id)
                elif isinstance(event, StreamReset):
                    answers[event.stream_id].reset = True
                    ended.add(event.stream_id)
            writer.write(h2.data_to_send())
    finally:
        writer.close()
    return chosen, list(answers.values())
