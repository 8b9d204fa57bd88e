"""The placement service's settings."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuledger_common.kubeconfig import KubeClientSettings
from gpuledger_common.settings import listen_host, option, require
from gpuledger_core.packing import POLICIES, Guard
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD, MAX_SLOTS_PER_CARD
from gpuledger_placement.assumed import DEFAULT_TTL_S

BIND_RETRY_S = 3.0  # 3 x kube_timeout_s (2 s) + this < the scheduler's httpTimeout (10 s)
MAX_ASSUME_TTL_S = 600.0  # kube-scheduler's longest wait before binding (volume binding's default)


@dataclass(frozen=True, slots=True)
class PlacementSettings(KubeClientSettings):
    """gpuledger-placement: chooses nodes and cards; kube-scheduler extender and NATS API. Without
    Kubernetes (kube) it filters and prioritizes but cannot bind."""

    http_host: str = option(
        "",
        "address of the extender and of /healthz, /readyz, /metrics (empty: 0.0.0.0 with the extender's TLS, "
        "else 127.0.0.1, since the verbs in plain HTTP take no authentication; set it to offer them elsewhere)",
    )
    http_port: int = option(8080, "port of the extender and the ops endpoints (0: any free port)")
    url_prefix: str = option("/gpuledger", "path the extender verbs hang under (the scheduler's urlPrefix path)")
    extender_cert_file: str = option(
        "",
        "the extender's TLS certificate: turns on HTTPS with client certificates (with the next two); the "
        "extender then listens on extender_port and http_port serves only /healthz, /readyz, /metrics",
    )
    extender_key_file: str = option("", "private key of extender_cert_file")
    extender_client_ca_file: str = option("", "CA whose client certificates (kube-scheduler's) may call the extender")
    extender_clients: str = option(
        "gpuledger-scheduler",
        "comma-separated common names of the client certificates that may call the extender (kube-scheduler's)",
    )
    extender_port: int = option(8443, "HTTPS port of the extender when extender_cert_file is set (0: any free port)")
    scheduler_names: str = option(
        "gpuledger-scheduler", "comma-separated schedulerName values of the pods this extender binds"
    )
    max_body_bytes: int = option(
        4 * 1024 * 1024, "the largest extender request body taken (larger: HTTP 413); a 5,000-node filter is ~0.2 MB"
    )
    policy: str = option("default", f"node policy unless a pod names one: {', '.join(POLICIES)}")
    guard: str = option("off", "dominant-resource guard: off, or CPU cores:GiB kept per free card, e.g. 4:32")
    kube_timeout_s: float = option(2.0, "timeout of each Kubernetes API call made by bind")
    ledger_retry_s: float = option(
        BIND_RETRY_S,
        "how long a bind waits out a JetStream outage (a leader election) before it answers Error; with "
        "3 kube calls of kube_timeout_s it must fit the scheduler's httpTimeout (10 s)",
    )
    lease_s: float = option(300.0, "how long a bound pod's reservation waits for kubelet to admit it")
    slots_per_card: int = option(
        DEFAULT_SLOTS_PER_CARD, "kubelet device slots per card (holders a card takes); must equal the plugin's setting"
    )
    mix_isolation: bool = option(
        False,
        "let mps and none tenants share a card (off: a card held by one isolation tier takes no sharer of the "
        "other; the allocator's setting must match)",
    )
    assume_ttl_s: float = option(
        DEFAULT_TTL_S,
        "how long the node filter chose for a pod holds the pod's room there while its bind is awaited",
    )
    stale_after_s: float = option(30.0, "a node without a heartbeat for this long gets nothing new (0: never)")
    workload_window: int = option(5000, "recent pod asks the fragmentation policies measure against")
    workload_refresh_s: float = option(30.0, "how often the fragmentation policies take in recent asks")
    dra_claims: str = option(
        "auto",
        "the claims controller (the ledger decides every ResourceClaim allocation of driver gpu.gpuledger.io, "
        "docs/dra.md): on, off, or auto (on where Kubernetes is reached and ResourceClaims may be listed)",
    )
    dra_allocation: str = option(
        "on",
        "DRA mode C (docs/dra-mode-c.md): with the claims controller, allocate the claims of pods gated "
        "gpuledger.io/allocate with the ledger's policy and lift the gate: on or off (such pods then wait)",
    )
    preemption: str = option(
        "on",
        "share-aware preemption (docs/preemption.md): for a pod no node fits, evict the fewest lower-priority "
        "holders of the cards it needs (Eviction API, PodDisruptionBudgets respected) and hold the room: on or off",
    )
    preemption_hold_s: float = option(120.0, "how long a preemption holds the room it freed for its pod, at least")
    defrag: str = option(
        "off",
        "defragmentation (docs/preemption.md): for a pod no node fits and preemption cannot help, move a few pods "
        "labelled gpuledger.io/movable=true that a controller recreates to other nodes where they fit: on or off",
    )
    defrag_max_moves: int = option(2, "pods defragmentation may move for one pod")
    defrag_moves_per_hour: int = option(10, "pods defragmentation may move per hour (each placement replica)")
    defrag_cooldown_s: float = option(3600.0, "a controller whose pod was moved has none moved again for this long")
    drain: str = option(
        "on",
        'draining failing cards (docs/remediation.md, "Draining a card"): evict the pods holding a card its '
        "node's inventory marked remedy drain (Eviction API, PodDisruptionBudgets respected, refusals tried again "
        "with a back-off); the inventory asks only where remediation is on: on or off",
    )
    over_grant_action: str = option(
        "report",
        "a pod using more of a card's memory than granted (docs/audit.md): report (a Warning Event on the pod) or "
        "evict (also evicted, through the Eviction API, if still over after over_grant_grace_s)",
    )
    over_grant_grace_s: float = option(300.0, "how long a pod may stay over its grant before over_grant_action evict")
    dra_memory_step_mib: int = option(256, "the inventory's dra_memory_step_mib: the slices' memory grid")
    nats_queue: str = option("placement", "NATS queue group of the placement subjects")
    stop_timeout_s: float = option(10.0, "how long in-flight requests may take to finish at shutdown")
    log_level: str = option("info", "debug, info, warning or error")
    log_format: str = option("text", "text or json")

    @property
    def extender_tls(self) -> bool:
        return bool(self.extender_cert_file)

    @property
    def listen_host(self) -> str:
        """Where the ports listen: ``http_host``, or by default every address when the verbs take
        client certificates (the ops port then serves no verb), loopback when they do not."""
        return listen_host(self.http_host, self.extender_tls)

    @property
    def clients(self) -> frozenset[str]:
        return _names(self.extender_clients)

    @property
    def schedulers(self) -> frozenset[str]:
        return _names(self.scheduler_names)

    def __post_init__(self) -> None:
        self.check_kube()
        tls = (self.extender_cert_file, self.extender_key_file, self.extender_client_ca_file)
        require(
            all(tls) or not any(tls),
            "extender_cert_file",
            "extender_cert_file, extender_key_file and extender_client_ca_file go together (HTTPS with client "
            "certificates)",
        )
        for name in ("extender_cert_file", "extender_key_file", "extender_client_ca_file"):
            path = getattr(self, name)
            require(not path or os.path.isfile(path), name, f"{path!r} is not a readable file")
        require(bool(self.clients), "extender_clients", "must name at least one client certificate common name")
        require(0 <= self.extender_port < 65536, "extender_port", "must be 0..65535")
        require(bool(self.schedulers), "scheduler_names", "must name at least one scheduler")
        require(1024 <= self.max_body_bytes <= 256 * 1024 * 1024, "max_body_bytes", "must be 1 KiB..256 MiB")
        require(0 <= self.http_port < 65536, "http_port", "must be 0..65535")
        require(
            (self.url_prefix.startswith("/") and not self.url_prefix.endswith("/")) or self.url_prefix == "",
            "url_prefix",
            f"must be empty or start with / and not end with /, got {self.url_prefix!r}",
        )
        require(self.policy in POLICIES, "policy", f"must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        parse_guard(self.guard)
        require(0 < self.kube_timeout_s <= 30, "kube_timeout_s", "must be in (0, 30]")
        require(0 <= self.ledger_retry_s <= 60, "ledger_retry_s", "must be 0..60 seconds")
        require(self.lease_s > 0, "lease_s", "must be positive")
        require(1 <= self.slots_per_card <= MAX_SLOTS_PER_CARD, "slots_per_card", f"must be 1..{MAX_SLOTS_PER_CARD}")
        require(0 < self.assume_ttl_s <= MAX_ASSUME_TTL_S, "assume_ttl_s", f"must be in (0, {MAX_ASSUME_TTL_S:g}]")
        claims_modes = ("auto", "on", "off")
        require(self.dra_claims in claims_modes, "dra_claims", f"must be auto, on or off, got {self.dra_claims!r}")
        require(self.dra_claims != "on" or self.kube != "off", "dra_claims", "on needs Kubernetes access (kube is off)")
        allocation = self.dra_allocation
        require(allocation in ("on", "off"), "dra_allocation", f"must be on or off, got {allocation!r}")
        require(self.preemption in ("on", "off"), "preemption", f"must be on or off, got {self.preemption!r}")
        require(10 <= self.preemption_hold_s <= 3600, "preemption_hold_s", "must be 10..3600 seconds")
        require(self.defrag in ("on", "off"), "defrag", f"must be on or off, got {self.defrag!r}")
        require(1 <= self.defrag_max_moves <= 64, "defrag_max_moves", "must be 1..64")
        require(0 <= self.defrag_moves_per_hour <= 10_000, "defrag_moves_per_hour", "must be 0..10000")
        require(0 <= self.defrag_cooldown_s <= 7 * 86400, "defrag_cooldown_s", "must be 0..604800 seconds")
        require(self.drain in ("on", "off"), "drain", f"must be on or off, got {self.drain!r}")
        action = self.over_grant_action
        require(action in ("report", "evict"), "over_grant_action", f"must be report or evict, got {action!r}")
        require(0 <= self.over_grant_grace_s <= 86400, "over_grant_grace_s", "must be 0..86400 seconds")
        require(1 <= self.dra_memory_step_mib <= 65536, "dra_memory_step_mib", "must be 1..65536")
        require(self.stale_after_s >= 0, "stale_after_s", "must not be negative")
        require(self.workload_window >= 1, "workload_window", "must be at least 1")
        require(self.workload_refresh_s > 0, "workload_refresh_s", "must be positive")
        require(self.stop_timeout_s > 0, "stop_timeout_s", "must be positive")
        require(self.log_format in ("text", "json"), "log_format", "must be text or json")
        require(
            self.log_level in ("debug", "info", "warning", "error"),
            "log_level",
            "must be debug, info, warning or error",
        )


def _names(raw: str) -> frozenset[str]:
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def parse_guard(raw: str) -> Guard | None:
    """``off`` or ``<CPU cores>:<GiB>`` kept free per free card."""
    if raw == "off":
        return None
    cpu, sep, mem = raw.partition(":")
    try:
        cores, gib = float(cpu), float(mem)
    except ValueError:
        cores = gib = -1.0
    require(bool(sep) and cores >= 0 and gib >= 0, "guard", f"must be off or <cores>:<GiB>, e.g. 4:32, got {raw!r}")
    return Guard(int(cores * 1000), int(gib * 1024))
