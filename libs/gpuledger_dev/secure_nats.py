"""A nats-server run as a deployment would run it: TLS on every client connection and one user
per role and node, with the permissions ``gpuledger_common.natsauth`` gives them."""

from __future__ import annotations

import contextlib
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpuledger_common.natsauth import Role, authorization_conf, tls_conf, user_name, users_for
from gpuledger_common.natscreds import NatsCredentials
from gpuledger_dev.natsserver import NatsServer, free_port
from gpuledger_dev.tlsca import ThrowawayCa


@dataclass
class SecureNats:
    server: NatsServer
    directory: Path
    ca: ThrowawayCa
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> str:
        """The server's log so far (what it refused, and why)."""
        return (self.directory / "nats.log").read_text()

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.server.port}"

    def credentials(self, role: Role, node: str = "", *, ca_file: str = "") -> NatsCredentials:
        """The credentials of the role's user (``node`` for a per-node role), its password in a
        file as a mounted Secret would hold it; ``ca_file`` instead of the server's real CA."""
        name = user_name(role, node)
        return self.password_credentials(name, self.passwords[name], ca_file=ca_file)

    def credential_settings(self, role: Role, node: str = "") -> dict[str, str]:
        """A service's ``nats_*`` settings for the role's user."""
        creds = self.credentials(role, node)
        return {
            "nats_user": creds.user,
            "nats_password_file": creds.password_file,
            "nats_ca_file": creds.ca_file,
        }

    def password_credentials(self, user: str, password: str, *, ca_file: str = "") -> NatsCredentials:
        path = self.directory / f"password-{user}-{secrets.token_hex(4)}"
        path.write_text(password + "\n")
        path.chmod(0o600)
        return NatsCredentials(user, str(path), ca_file or str(self.ca.cert))


def server_conf(nodes: Iterable[str], passwords: dict[str, str], cert: str, key: str, ca: str) -> str:
    return tls_conf(cert, key, ca) + authorization_conf(users_for(nodes, passwords))


@contextlib.asynccontextmanager
async def secure_nats(nodes: Iterable[str]) -> AsyncIterator[SecureNats]:
    """A nats-server with JetStream, TLS and a user per role and per node of ``nodes``."""
    nodes = sorted(set(nodes))
    with tempfile.TemporaryDirectory(prefix="gpuledger-secure-nats-") as tmp:
        directory = Path(tmp)
        ca = ThrowawayCa(directory / "pki")
        served = ca.issue("nats-server")
        names = [user_name(r, "") for r in Role if r not in (Role.INVENTORY, Role.PLUGIN)]
        names += [user_name(r, n) for n in nodes for r in (Role.INVENTORY, Role.PLUGIN)]
        passwords = {name: secrets.token_urlsafe(24) for name in names}
        conf = directory / "nats.conf"
        conf.write_text(server_conf(nodes, passwords, str(served.cert), str(served.key), str(ca.cert)))
        store = directory / "store"
        store.mkdir()
        server = NatsServer(free_port(), str(store), ("-c", str(conf), "-l", str(directory / "nats.log")))
        await server.start()
        try:
            yield SecureNats(server, directory, ca, passwords)
        finally:
            await server.stop()
