"""Keys and certificates for a control plane on loopback: a CA, the API server's serving
certificate (for 127.0.0.1 and localhost), the API server's client certificate for kubelets
(``logs``, ``exec``), the service-account signing key, and certificates a real node asks for later
(``issue``: its kubelet's client and serving certificates). Every certificate carries the key
identifiers that Python 3.13's strict default verification asks for."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuledger_dev.tlsca import subject_names

VALID_FOR = datetime.timedelta(days=2)


@dataclass(frozen=True, slots=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    sa_key: Path  # signs and verifies service-account tokens (one RSA key serves both flags)
    ca_key: Path
    kubelet_client_cert: Path  # the API server's identity towards kubelets (system:masters)
    kubelet_client_key: Path

    def ca_pem(self) -> bytes:
        return self.ca_cert.read_bytes()

    def issue(
        self,
        stem: str,
        common_name: str,
        groups: tuple[str, ...] = (),
        *,
        client: bool = False,
        hosts: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """A certificate signed by this CA, written as ``<stem>.crt`` and ``<stem>.key`` beside it:
        for a client (``common_name`` and ``groups`` are its user and groups) or a server (``hosts``)."""
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        assert isinstance(ca_key, rsa.RSAPrivateKey)
        cert, key = _signed(ca_key, common_name, groups, client=client, hosts=hosts)
        paths = self.ca_cert.parent / f"{stem}.crt", self.ca_cert.parent / f"{stem}.key"
        paths[0].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths[1].write_bytes(_pem(key))
        paths[1].chmod(0o600)
        return paths


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common: str, groups: tuple[str, ...] = ()) -> x509.Name:
    organizations = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    return x509.Name([*organizations, x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _builder(
    subject: str, issuer: str, key: rsa.RSAPrivateKey, groups: tuple[str, ...] = ()
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject, groups))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
    )


def make_pki(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Pki:
    """Write a fresh CA, a serving certificate for ``hosts`` and a service-account key under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = (
        _builder("gpuledger-test-ca", "gpuledger-test-ca", ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(
        directory / "ca.crt",
        directory / "apiserver.crt",
        directory / "apiserver.key",
        directory / "sa.key",
        directory / "ca.key",
        directory / "apiserver-kubelet-client.crt",
        directory / "apiserver-kubelet-client.key",
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.ca_key.write_bytes(_pem(ca_key))
    pki.sa_key.write_bytes(_pem(_key()))
    for key in (pki.ca_key, pki.sa_key):
        key.chmod(0o600)
    pki.issue("apiserver", "kube-apiserver", hosts=hosts)
    pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",), client=True)
    return pki


def _signed(
    ca_key: rsa.RSAPrivateKey, common_name: str, groups: tuple[str, ...], *, client: bool, hosts: tuple[str, ...]
) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
    key = _key()
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = _builder(common_name, "gpuledger-test-ca", key, groups)
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(subject_names(hosts)), critical=False)
    cert = (
        builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key
