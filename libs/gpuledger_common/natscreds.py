"""A NATS client's credentials: a user whose password is read from a file (a mounted Secret),
and TLS (the CA that verifies the server, optionally a client certificate and key).

Every service's settings carry the same five fields (``nats_user``, ``nats_password_file``,
``nats_ca_file``, ``nats_cert_file``, ``nats_key_file``), with ``nats_url`` (flag ``--nats-url``
or ``--nats``): every service's settings class takes them from ``NatsClientSettings``, declared
once here (a service that reaches Kubernetes too, through ``kubeconfig.KubeClientSettings``).
``credentials_of`` turns them into one validated value. The password is read when connecting,
never held in the settings, so it cannot reach the start-up log.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any

from gpuledger_common.settings import SettingsError, nats_servers, option

FIELDS = ("nats_user", "nats_password_file", "nats_ca_file", "nats_cert_file", "nats_key_file")
HELP = {
    "nats_user": "NATS user (each role and node has its own; see docs/security.md); needs nats_password_file",
    "nats_password_file": "file holding the NATS user's password (a mounted Secret), read at connect",
    "nats_ca_file": "CA certificate(s) that verify the NATS server: turns TLS on",
    "nats_cert_file": "client certificate presented to NATS (with nats_key_file)",
    "nats_key_file": "private key of nats_cert_file",
}


@dataclass(frozen=True, slots=True)
class NatsClientSettings:
    """How a service reaches NATS: its servers and its credentials. A service's settings class
    derives from it and calls ``check_nats`` in its ``__post_init__``."""

    nats_url: str = option(
        "nats://127.0.0.1:4222",
        "NATS servers: one URL or a comma-separated list (nats://a:4222,nats://b:4222)",
        aliases=("--nats",),
    )
    nats_user: str = option("", HELP["nats_user"])
    nats_password_file: str = option("", HELP["nats_password_file"])
    nats_ca_file: str = option("", HELP["nats_ca_file"])
    nats_cert_file: str = option("", HELP["nats_cert_file"])
    nats_key_file: str = option("", HELP["nats_key_file"])

    def check_nats(self) -> None:
        nats_servers(self.nats_url)
        credentials_of(self)


@dataclass(frozen=True, slots=True)
class NatsCredentials:
    user: str = ""
    password_file: str = ""
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.user) != bool(self.password_file):
            raise SettingsError("nats_user: nats_user and nats_password_file go together")
        if bool(self.cert_file) != bool(self.key_file):
            raise SettingsError("nats_cert_file: nats_cert_file and nats_key_file go together")
        if self.cert_file and not self.ca_file:
            raise SettingsError("nats_ca_file: a client certificate needs the CA that verifies the server")
        for name in ("password_file", "ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise SettingsError(f"nats_{name}: {path!r} is not a readable file")

    @property
    def tls(self) -> bool:
        return bool(self.ca_file)

    def password(self) -> str:
        try:
            with open(self.password_file, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as err:
            raise SettingsError(f"nats_password_file: cannot read {self.password_file!r}: {err.strerror}") from err

    def tls_context(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        except (ssl.SSLError, OSError) as err:
            raise SettingsError(f"nats_ca_file: {self.ca_file!r} holds no usable CA certificate: {err}") from err
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (ssl.SSLError, OSError) as err:
                raise SettingsError(f"nats_cert_file: cannot load it with nats_key_file: {err}") from err
        return context

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``: the user, its password, its own inbox prefix
        (``_INBOX.<user>``, the only inbox its permissions let it subscribe to) and TLS."""
        options: dict[str, Any] = {}
        if self.user:
            options.update(user=self.user, password=self.password(), inbox_prefix=inbox_prefix(self.user))
        if self.tls:
            options["tls"] = self.tls_context()
        return options


NONE = NatsCredentials()


def inbox_prefix(user: str) -> str:
    """The inbox prefix of ``user``'s connections: only that user may subscribe below it."""
    return f"_INBOX.{user}"


def credentials_of(settings: object) -> NatsCredentials:
    """The validated credentials in a settings object's ``nats_*`` fields."""
    return NatsCredentials(*(str(getattr(settings, name, "") or "") for name in FIELDS))
