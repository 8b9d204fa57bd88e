"""Certificates for the extender channel on loopback: placement's server certificate and the client
certificate kube-scheduler presents (common name ``gpuledger-scheduler``, the name placement lets
in by default), from one throwaway CA that both sides trust."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuledger_common.tls import HTTP1_ALPN, client_context
from gpuledger_dev.tlsca import Issued, ThrowawayCa

SCHEDULER_CLIENT = "gpuledger-scheduler"


@dataclass
class ExtenderPki:
    directory: Path
    ca: ThrowawayCa = field(init=False)
    server: Issued = field(init=False)
    scheduler: Issued = field(init=False)

    def __post_init__(self) -> None:
        self.ca = ThrowawayCa(self.directory, "gpuledger-extender-ca")
        self.server = self.ca.issue("gpuledger-placement")
        self.scheduler = self.ca.issue(SCHEDULER_CLIENT, client=True)

    def placement_flags(self) -> list[str]:
        """The placement service's settings for HTTPS with client certificates."""
        return [
            "--extender-cert-file",
            str(self.server.cert),
            "--extender-key-file",
            str(self.server.key),
            "--extender-client-ca-file",
            str(self.ca.cert),
        ]

    def scheduler_tls(self) -> dict[str, Any]:
        """The ``tlsConfig`` of kube-scheduler's extender entry (KubeSchedulerConfiguration v1)."""
        return {"certFile": str(self.scheduler.cert), "keyFile": str(self.scheduler.key), "caFile": str(self.ca.cert)}

    def client(self, issued: Issued | None = None) -> ssl.SSLContext:
        """A client's TLS context: the scheduler's certificate, or ``issued``'s."""
        cert = issued or self.scheduler
        return client_context(str(self.ca.cert), str(cert.cert), str(cert.key), alpn=HTTP1_ALPN)
