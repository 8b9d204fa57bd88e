"""The allocator's settings."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuledger_common.kubeconfig import KubeClientSettings
from gpuledger_common.settings import listen_host, option, require
from gpuledger_common.store.outage import RETRY_S
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD, MAX_SLOTS_PER_CARD


@dataclass(frozen=True, slots=True)
class AllocatorSettings(KubeClientSettings):
    """gpuledger-allocator: owns the ledger of cards; NATS and gRPC APIs. Kubernetes (kube) is for
    reconciling the ledger with pods."""

    grpc_host: str = option(
        "",
        "gRPC listen address (empty: 0.0.0.0 with mutual TLS, else 127.0.0.1, since without TLS every caller "
        "may act on every allocation; set it to offer gRPC without TLS elsewhere)",
    )
    grpc_port: int = option(50051, "gRPC listen port (0: any free port)")
    grpc_cert_file: str = option("", "the gRPC server's TLS certificate: turns on mutual TLS (with the next two)")
    grpc_key_file: str = option("", "private key of grpc_cert_file")
    grpc_client_ca_file: str = option("", "CA whose client certificates may call the gRPC API")
    grpc_admins: str = option(
        "", "comma-separated client identities (certificate common names) that may act on every allocation"
    )
    http_host: str = option("0.0.0.0", "address for /healthz, /readyz, /metrics")
    http_port: int = option(8081, "port for /healthz, /readyz, /metrics (0: any free port)")
    lease_s: float = option(60.0, "how long a reservation lives unless committed")
    max_lease_s: float = option(3600.0, "the longest lease a caller may ask for")
    stale_after_s: float = option(30.0, "a node whose heartbeat is older than this gets nothing new")
    sweep_interval_s: float = option(2.0, "how often expired reservations are swept")
    slots_per_card: int = option(
        DEFAULT_SLOTS_PER_CARD,
        "kubelet device slots per card; must equal the plugin's setting (a tool's allocation holds one per card)",
    )
    mix_isolation: bool = option(
        False,
        "let mps and none tenants share a card (off: a card held by one isolation tier takes no sharer of the "
        "other; placement's setting must match)",
    )
    tool_drain_grace_s: float = option(
        300.0,
        "how long a tool holding a card under repair is given to let it go, from when it is told, before "
        "its allocation is released (0: at once)",
    )
    cas_attempts: int = option(12, "compare-and-set attempts per ledger change before giving up")
    ledger_retry_s: float = option(
        RETRY_S,
        "how long a request waits out a JetStream outage (a leader election, a lost server) before it is "
        "refused as unavailable; a gRPC caller's deadline shortens it",
    )
    bucket_replicas: int = option(1, "JetStream replicas for the ledger buckets")
    placement_timeout_s: float = option(0.5, "how long to wait for the placement service before fitting alone")
    placement_retry_s: float = option(2.0, "after placement did not answer, how long to fit alone before asking again")
    placement_ahead_s: float = option(
        1.0,
        "placement's next answer for a shape of request is asked once a request of that shape is answered; "
        "the next one takes it if its node is unchanged and it is at most this old (0: ask during each request)",
    )
    reconcile_interval_s: float = option(
        30.0,
        "how often the ledger is compared with the followed pods (a pod that ends or goes away also "
        "starts a round at once)",
    )
    reconcile_grace_s: float = option(
        30.0, "an allocation younger than this when a round starts is not released for a pod it lacks"
    )
    reconcile_field_selector: str = option(
        "spec.schedulerName=gpuledger-scheduler",
        "the pods the reconciler lists and watches (a Kubernetes field selector; empty: every pod)",
    )
    reconcile_relist_s: float = option(
        600.0, "how often the pod watch starts again from a full listing (a safety net; watches resume on their own)"
    )
    trends_step_s: float = option(30.0, "how often the dashboard's trends take the cluster's totals (kept in memory)")
    trends_hours: float = option(24.0, "how many hours of the cluster's totals the dashboard's trends keep")
    node_trends_step_s: float = option(300.0, "how often the dashboard's trends take every node's totals")
    node_trends_hours: float = option(6.0, "how many hours of every node's totals the dashboard's trends keep")
    log_level: str = option("info", "debug, info, warning or error")
    log_format: str = option("text", "text or json")

    @property
    def grpc_tls(self) -> bool:
        return bool(self.grpc_cert_file)

    @property
    def grpc_listen_host(self) -> str:
        """Where gRPC listens: ``grpc_host``, or by default every address with mutual TLS, loopback without."""
        return listen_host(self.grpc_host, self.grpc_tls)

    @property
    def admins(self) -> frozenset[str]:
        return frozenset(name.strip() for name in self.grpc_admins.split(",") if name.strip())

    def __post_init__(self) -> None:
        self.check_kube()
        tls = (self.grpc_cert_file, self.grpc_key_file, self.grpc_client_ca_file)
        require(
            all(tls) or not any(tls),
            "grpc_cert_file",
            "grpc_cert_file, grpc_key_file and grpc_client_ca_file go together (mutual TLS)",
        )
        for name in ("grpc_cert_file", "grpc_key_file", "grpc_client_ca_file"):
            path = getattr(self, name)
            require(not path or os.path.isfile(path), name, f"{path!r} is not a readable file")
        require(not self.grpc_admins or all(tls), "grpc_admins", "needs mutual TLS (grpc_cert_file, ...)")
        require(0 <= self.grpc_port < 65536, "grpc_port", "must be 0..65535")
        require(0 <= self.http_port < 65536, "http_port", "must be 0..65535")
        require(self.lease_s > 0, "lease_s", "must be positive")
        require(self.max_lease_s >= self.lease_s, "max_lease_s", "must be at least lease_s")
        require(self.stale_after_s > 0, "stale_after_s", "must be positive")
        require(self.sweep_interval_s > 0, "sweep_interval_s", "must be positive")
        require(self.placement_retry_s >= 0, "placement_retry_s", "must not be negative")
        require(0 <= self.placement_ahead_s <= 60, "placement_ahead_s", "must be 0..60 seconds")
        require(1 <= self.slots_per_card <= MAX_SLOTS_PER_CARD, "slots_per_card", f"must be 1..{MAX_SLOTS_PER_CARD}")
        require(0 <= self.tool_drain_grace_s <= 86400, "tool_drain_grace_s", "must be 0..86400 seconds")
        require(self.cas_attempts >= 1, "cas_attempts", "must be at least 1")
        require(0 <= self.ledger_retry_s <= 60, "ledger_retry_s", "must be 0..60 seconds")
        require(self.bucket_replicas in (1, 3, 5), "bucket_replicas", "must be 1, 3 or 5")
        require(self.reconcile_interval_s > 0, "reconcile_interval_s", "must be positive")
        require(self.reconcile_grace_s >= 0, "reconcile_grace_s", "must not be negative")
        require(self.reconcile_relist_s > 0, "reconcile_relist_s", "must be positive")
        self._check_trends()
        require(self.log_format in ("text", "json"), "log_format", "must be text or json")
        require(
            self.log_level in ("debug", "info", "warning", "error"),
            "log_level",
            "must be debug, info, warning or error",
        )

    def _check_trends(self) -> None:
        require(0.05 <= self.trends_step_s <= 3600, "trends_step_s", "must be 0.05..3600 seconds")
        require(
            self.trends_step_s <= self.node_trends_step_s <= 86400,
            "node_trends_step_s",
            "must be at least trends_step_s and at most 86400 seconds",
        )
        for name, step in (("trends_hours", self.trends_step_s), ("node_trends_hours", self.node_trends_step_s)):
            hours = getattr(self, name)
            require(0 < hours <= 24 * 14, name, "must be more than 0 and at most 336 hours")
            require(hours * 3600 / step <= 100_000, name, "keeps at most 100000 samples: take a longer step")
