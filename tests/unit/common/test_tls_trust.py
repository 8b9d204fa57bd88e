"""gpuledger's TLS contexts trust the CA they are given and nothing else: not the system's CA store
(which ``ssl.create_default_context`` would load), whose certificates anyone can buy. A client
certificate with the right common name from a CA the system trusts is refused by our servers, and
our clients refuse a server certificate from such a CA."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from gpuledger_common.pki import CertificateAuthority
from gpuledger_common.tls import HTTP1_ALPN, client_context, server_context
from gpuledger_dev.controlplane.pki import make_pki


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str = "127.0.0.1") -> str:
    """'' when both sides complete the handshake, else the error either side saw."""
    left, right = socket.socketpair()
    errors: list[str] = []

    def serve() -> None:
        try:
            with server.wrap_socket(left, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError) as err:
            errors.append(f"server: {err}")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(right, server_hostname=hostname) as tls:
            tls.sendall(b"x")
    except (ssl.SSLError, OSError) as err:
        errors.append(f"client: {err}")
    thread.join(10)
    return "; ".join(errors)


@pytest.fixture
def system_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CertificateAuthority:
    """A CA that OpenSSL's default verify paths trust (SSL_CERT_FILE), as a public CA would be."""
    ca = CertificateAuthority(tmp_path / "system", "a-public-ca")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "nowhere"))
    return ca


def test_a_client_certificate_from_a_system_trusted_ca_is_refused(
    tmp_path: Path, system_ca: CertificateAuthority
) -> None:
    ours = CertificateAuthority(tmp_path / "ours")
    served = ours.issue("gpuledger-placement")
    server = server_context(str(served.cert), str(served.key), str(ours.cert), alpn=HTTP1_ALPN, setting="extender")
    good = ours.issue("gpuledger-scheduler", client=True)
    assert handshake(server, client_context(str(ours.cert), str(good.cert), str(good.key), alpn=HTTP1_ALPN)) == ""
    bought = system_ca.issue("gpuledger-scheduler", client=True)  # the right name, the wrong issuer
    refused = handshake(server, client_context(str(ours.cert), str(bought.cert), str(bought.key), alpn=HTTP1_ALPN))
    assert refused, "a client certificate of a CA the system trusts got through"


def test_a_client_refuses_a_server_certificate_from_a_system_trusted_ca(
    tmp_path: Path, system_ca: CertificateAuthority
) -> None:
    ours = CertificateAuthority(tmp_path / "ours")
    impostor = system_ca.issue("gpuledger-allocator")
    server = server_context(str(impostor.cert), str(impostor.key), str(system_ca.cert), alpn=HTTP1_ALPN)
    mine = system_ca.issue("cli", client=True)
    refused = handshake(server, client_context(str(ours.cert), str(mine.cert), str(mine.key), alpn=HTTP1_ALPN))
    assert "client:" in refused, "our client trusted a server certificate of a CA the system trusts"


def strict(context: ssl.SSLContext) -> ssl.SSLContext:
    """As Python 3.13's ``ssl.create_default_context`` verifies (which natscreds, kuberaw and the
    control plane's clients use): RFC 5280 strictly, so a CA-issued certificate must name its
    issuer's key (Authority Key Identifier)."""
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def test_our_certificates_pass_strict_verification_both_ways(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    served, client = ca.issue("gpuledger-allocator"), ca.issue("cli", client=True)
    server = strict(server_context(str(served.cert), str(served.key), str(ca.cert), alpn=HTTP1_ALPN))
    ours = strict(client_context(str(ca.cert), str(client.cert), str(client.key), alpn=HTTP1_ALPN))
    assert handshake(server, ours) == ""


def test_the_control_planes_certificates_pass_strict_verification(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.server_cert, pki.server_key)
    assert handshake(server, strict(ssl.create_default_context(cadata=pki.ca_pem().decode()))) == ""
