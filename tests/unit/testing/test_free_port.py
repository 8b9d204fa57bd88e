"""The loopback ports handed out for servers started a moment later."""

from __future__ import annotations

import socket

from gpuledger_dev import natsserver
from gpuledger_dev.natsserver import free_port


def test_a_port_handed_out_is_not_handed_out_again_before_it_is_bound() -> None:
    # a service asks for its gRPC and its HTTP port before it binds either: the two must differ,
    # and so must every other port handed out lately
    given = [free_port() for _ in range(natsserver.RECENT_PORTS)]
    assert len(set(given)) == len(given)


def test_the_port_is_free_and_below_the_range_for_outgoing_connections() -> None:
    port = free_port()
    low = int(natsserver.EPHEMERAL.read_text().split()[0])
    assert natsserver.LOWEST_PORT <= port < low
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
