"""A small certificate authority: server and client certificates for gpuledger's channels (NATS,
the allocator's gRPC API, the extender), for tests, the local stack and ``gpuledger
local-credentials`` (docker compose). Production certificates come from the cluster's own CA
(cert-manager, docs/operator-guide.md).

EC keys (P-256): quick to make on a busy machine, and read by nats-server, Python's ssl and
grpclib alike. The CA's key lives only in memory: once its certificates are issued, nobody can
issue more with it. Every certificate carries the key identifiers RFC 5280 asks for (the subject's,
and the issuer's on those the CA issues): Python 3.13's default TLS context verifies strictly and
refuses a CA-issued certificate without an Authority Key Identifier.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=2)  # tests and the local stack
LOOPBACK = ("127.0.0.1", "localhost")


@dataclass(frozen=True, slots=True)
class Issued:
    cert: Path
    key: Path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def subject_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    """The subject alternative names for ``hosts``: IP addresses as such, anything else as DNS."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


@dataclass
class CertificateAuthority:
    """A CA whose certificate is ``cert``; ``issue`` writes a certificate and key beside it."""

    directory: Path
    name: str = "gpuledger-test-ca"
    valid_for: datetime.timedelta = VALID_FOR
    _key: ec.EllipticCurvePrivateKey = field(init=False)
    cert: Path = field(init=False)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)])
        ca = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + self.valid_for)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.cert = self.directory / f"{self.name}.crt"
        self.cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def issue(self, common: str, hosts: tuple[str, ...] = LOOPBACK, *, client: bool = False) -> Issued:
        """A certificate for ``common``: a server's for ``hosts``, or with ``client`` a client's
        (its common name is the identity a server reads from it)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + self.valid_for)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
        )
        if not client:
            builder = builder.add_extension(x509.SubjectAlternativeName(subject_names(hosts)), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.directory / f"{common}.crt", self.directory / f"{common}.key")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(_pem_key(key))
        issued.key.chmod(0o600)
        return issued
