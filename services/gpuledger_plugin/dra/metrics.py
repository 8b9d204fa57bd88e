"""The DRA plugin's Prometheus metrics (served on /metrics with the rest of the process's)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

CLAIMS = Counter(
    "gpuledger_plugin_dra_claims_total",
    "Claims kubelet asked to prepare or unprepare, by call and outcome (ok or error)",
    ["call", "outcome"],
)
CLAIM_SECONDS = Histogram(
    "gpuledger_plugin_dra_claim_seconds",
    "Time to prepare or unprepare one claim, by call",
    ["call"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 45.0),
)
