"""Where the APIs listen: the allocator's gRPC without TLS, and placement's extender in plain HTTP,
take no authentication, so by default they listen on loopback only and say so at start; an
explicit host setting offers them there; with TLS and client certificates they listen on every
address. The listening sockets are read from the kernel's table (/proc/net/tcp), not from our
own logs, of a real allocator and placement over a real nats-server."""

from __future__ import annotations

import logging
import socket
import struct
from pathlib import Path

import pytest

from gpuledger_common.tls import client_context
from gpuledger_dev.extender_pki import ExtenderPki
from gpuledger_dev.natsserver import NatsServer
from gpuledger_dev.tlsca import ThrowawayCa
from tests.support.replicas import RunningAllocator, running_allocator, running_placement

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
LISTEN = "0A"  # the state column of a listening socket


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses with a socket listening on ``port``."""
    found: set[str] = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == LISTEN and int(hex_port, 16) == port:
            found.add(socket.inet_ntoa(struct.pack("<I", int(address, 16))))
    return found


def warnings_of(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.WARNING]


@pytest.mark.parametrize(("host", "expected"), [("", "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
async def test_grpc_without_tls_listens_on_loopback_unless_a_host_is_given_and_warns(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture, host: str, expected: str
) -> None:
    caplog.set_level(logging.WARNING, "gpuledger_allocator.app")
    async with running_allocator(nats_server.url, grpc_host=host) as running:
        port = running.settings.grpc_port
        assert listening_on(port) == {expected}
        said = [w for w in warnings_of(caplog, "gpuledger_allocator.app") if w.startswith("gRPC on")]
        assert said == [
            f"gRPC on {expected}:{port} without TLS and without authentication: every caller that reaches it "
            "may act on every allocation (set grpc_cert_file, grpc_key_file and grpc_client_ca_file for mutual TLS)"
        ]


async def test_grpc_with_mutual_tls_listens_on_every_address_without_a_warning(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, "gpuledger_allocator.app")
    ca = ThrowawayCa(tmp_path / "ca")
    served, admin = ca.issue("allocator"), ca.issue("admin", client=True)
    tls = {
        "grpc_host": "",
        "grpc_cert_file": str(served.cert),
        "grpc_key_file": str(served.key),
        "grpc_client_ca_file": str(ca.cert),
    }
    client = client_context(str(ca.cert), str(admin.cert), str(admin.key))
    async with running_allocator(nats_server.url, client_tls=client, **tls) as running:
        assert listening_on(running.settings.grpc_port) == {"0.0.0.0"}
        assert not [w for w in warnings_of(caplog, "gpuledger_allocator.app") if w.startswith("gRPC on")]


@pytest.mark.parametrize(("host", "expected"), [("", "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
async def test_the_extender_in_plain_http_listens_on_loopback_unless_a_host_is_given_and_warns(
    nats_server: NatsServer,
    allocator: RunningAllocator,
    caplog: pytest.LogCaptureFixture,
    host: str,
    expected: str,
) -> None:
    caplog.set_level(logging.WARNING, "gpuledger_placement.app")
    async with running_placement(nats_server.url, http_host=host) as running:
        port = running.settings.http_port
        assert listening_on(port) == {expected}
        assert f"the extender on {expected}:{port} takes plain HTTP without authentication" in " ".join(
            warnings_of(caplog, "gpuledger_placement.app")
        )


async def test_the_extender_over_https_and_its_ops_port_listen_on_every_address(
    nats_server: NatsServer, allocator: RunningAllocator, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, "gpuledger_placement.app")
    pki = ExtenderPki(tmp_path / "pki")
    tls = {
        "http_host": "",
        "extender_cert_file": str(pki.server.cert),
        "extender_key_file": str(pki.server.key),
        "extender_client_ca_file": str(pki.ca.cert),
    }
    async with running_placement(nats_server.url, **tls) as running:
        assert listening_on(running.settings.http_port) == {"0.0.0.0"}
        assert listening_on(running.settings.extender_port) == {"0.0.0.0"}
        assert not [w for w in warnings_of(caplog, "gpuledger_placement.app") if "plain HTTP" in w]
