"""Mutual TLS for gpuledger's own servers: the allocator's gRPC API (HTTP/2) and placement's
kube-scheduler extender (HTTP/1.1). The server's and the client's SSL contexts, and the caller's
identity (its certificate's common name).

TLS 1.2 or later. Each side trusts only the CA file it is given, never the system's CA store. A
server requires a client certificate signed by its client CA: a caller without one is refused in
the handshake. ALPN is ``h2`` for gRPC; the extender offers ``h2`` first and
``http/1.1`` (``EXTENDER_ALPN``: kube-scheduler's Go client takes HTTP/2, one connection for every
call; a client offering only ``http/1.1`` gets it).

Servers issue no session tickets: none of our clients resumes a session (Go's net/http keeps no
session cache unless told to, Python's asyncio never resumes), and with OpenSSL 3.0 the two tickets
of a TLS 1.3 handshake cost the server about 0.6 ms of its 2 ms.
"""

from __future__ import annotations

import ssl
from typing import Any

from gpuledger_common.settings import SettingsError

GRPC_ALPN = ("h2",)
HTTP1_ALPN = ("http/1.1",)
EXTENDER_ALPN = ("h2", "http/1.1")


def server_context(
    cert_file: str,
    key_file: str,
    client_ca_file: str,
    *,
    alpn: tuple[str, ...] = GRPC_ALPN,
    setting: str = "grpc",
) -> ssl.SSLContext:
    """``setting``: the prefix of the settings named in errors (``grpc``: ``grpc_cert_file`` ...)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # trusts nothing until _trust: no system CA
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, cert_file, key_file, f"{setting}_cert_file")
    _trust(context, client_ca_file, f"{setting}_client_ca_file")
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(list(alpn))
    context.num_tickets = 0  # no client resumes a session (see above)
    return context


def client_context(
    ca_file: str, cert_file: str = "", key_file: str = "", *, alpn: tuple[str, ...] = GRPC_ALPN
) -> ssl.SSLContext:
    # Not ssl.create_default_context: it would trust the system's CA store too, so any server with a
    # certificate a public CA issued for the name would pass. Verification and host names are on.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _trust(context, ca_file, "--ca-file")
    if cert_file:
        _load(context, cert_file, key_file, "--cert-file")
    context.set_alpn_protocols(list(alpn))
    return context


def identity_of(peercert: dict[str, Any] | None) -> str:
    """The common name of a verified peer certificate (``ssl.SSLSocket.getpeercert()``)."""
    for rdn in (peercert or {}).get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return ""


def _load(context: ssl.SSLContext, cert_file: str, key_file: str, field: str) -> None:
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as err:
        raise SettingsError(f"{field}: cannot load {cert_file!r} with its key {key_file!r}: {err}") from err


def _trust(context: ssl.SSLContext, ca_file: str, field: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except (ssl.SSLError, OSError) as err:
        raise SettingsError(f"{field}: {ca_file!r} holds no usable CA certificate: {err}") from err
