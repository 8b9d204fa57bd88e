"""The placement service's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

EXTENDER_SECONDS = Histogram(
    "gpuledger_placement_extender_seconds", "Time to answer a kube-scheduler extender call", ["verb"], buckets=BUCKETS
)
EXTENDER_CONNECTIONS = Counter(
    "gpuledger_placement_extender_connections_total",
    "Connections (TLS handshakes) taken on the extender's HTTPS port, by the protocol chosen (h2, http/1.1)",
    ["protocol"],
)
NATS_SECONDS = Histogram(
    "gpuledger_placement_nats_seconds", "Time to answer a placement request over NATS", ["subject"], buckets=BUCKETS
)
DECISIONS = Counter(
    "gpuledger_placement_decisions_total",
    "Answers given, by verb and outcome (fit, no_fit, passthrough, bound, rebound)",
    ["verb", "outcome"],
)
NODES_FILTERED = Counter("gpuledger_placement_filtered_nodes_total", "Nodes judged by filter, by result", ["result"])
FAILURES = Counter("gpuledger_placement_failures_total", "Calls that failed, by verb and error code", ["verb", "code"])
ROLLBACKS = Counter("gpuledger_placement_bind_rollbacks_total", "Reservations released because the bind failed")
ASSUMPTIONS = Counter(
    "gpuledger_placement_assumptions_total",
    "Pods filter placed on a node before their bind: made, and how each ended "
    "(written, bound, failed, refiltered, expired)",
    ["event"],
)
ASSUMED = Gauge("gpuledger_placement_assumed_pods", "Pods placed by filter whose reservation is not in the view yet")
CLAIMS = Counter(
    "gpuledger_placement_claims_total",
    "ResourceClaims settled by the claims controller, by outcome (committed, rejected, mirrored, kept, released, "
    "conflict: allocated by the scheduler without waiting and refused by the ledger, error: tried again)",
    ["outcome"],
)
ORPHAN_RELEASE_FAILURES = Counter(
    "gpuledger_placement_claim_orphan_release_failures_total",
    "Ledger entries of claims that no ResourceClaim holds whose release failed, by error code (tried again after "
    "the next listing of the claims)",
    ["code"],
)
PREEMPTIONS = Counter(
    "gpuledger_placement_preemptions_total",
    "Share-aware preemption (docs/preemption.md): pods evicted, evictions refused (a budget, the API "
    "server busy), rooms held for a preempting pod",
    ["outcome"],
)
DEFRAG_MOVES = Counter(
    "gpuledger_placement_defrag_moves_total",
    "Defragmentation (docs/preemption.md): movable pods moved to make room for a pod that fit nowhere, "
    "and evictions refused (a budget, the API server busy)",
    ["outcome"],
)
CLAIMS_ALLOCATED = Counter(
    "gpuledger_placement_claims_allocated_total",
    "ResourceClaims of gated pods allocated by the ledger (DRA mode C: docs/dra-mode-c.md)",
)
CLAIM_COMMIT_SECONDS = Histogram(
    "gpuledger_placement_claim_commit_seconds",
    "From a claim's allocationTimestamp to its gpuledger.io/committed condition written",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
DRAIN_EVICTIONS = Counter(
    "gpuledger_placement_drain_evictions_total",
    'Pods holding a card whose remedy is drain (docs/remediation.md, "Draining a card"), by result: evicted, '
    "refused (a budget, the API server busy: tried again after a back-off), gone (before its eviction)",
    ["result"],
)
CARDS_DRAINING = Gauge(
    "gpuledger_placement_draining_cards", "Cards whose remedy is drain in the ledger, whose holders placement evicts"
)

OVER_GRANT_ACTIONS = Counter(
    "gpuledger_placement_over_grant_actions_total",
    "Pods over their grant on a card (docs/audit.md): told (the Event recorded by this replica), evicted, "
    "refused (an eviction a PodDisruptionBudget or the API server refused; tried again)",
    ["action"],
)
