"""Prometheus metrics shared by the services (each service adds its own beside these)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

CAS_ATTEMPTS = Counter("gpuledger_ledger_cas_attempts_total", "Compare-and-set writes tried on the ledger")
CAS_CONFLICTS = Counter(
    "gpuledger_ledger_cas_conflicts_total", "Compare-and-set writes that lost a race and were retried"
)
CAS_GAVE_UP = Counter(
    "gpuledger_ledger_cas_gave_up_total", "Ledger changes abandoned after the bounded number of retries"
)
LEDGER_YIELDS = Counter(
    "gpuledger_ledger_yields_total",
    "Pauses on a node's key: asked of the other writers after lost races in a row (way=asked), taken "
    "because another writer asked (way=taken), or a request that was no writer's dropped (way=forged: a "
    "JetStream delivery aimed at the yield subject)",
    ["way"],
)
LEDGER_UNREADABLE = Counter(
    "gpuledger_ledger_unreadable_values_total",
    "Values of a node's ledger key that could not be read (the node gets nothing new until its key holds a "
    "readable one); each value counted once per process",
)
OUTAGE_RETRIES = Counter(
    "gpuledger_ledger_outage_retries_total",
    "Ledger reads and writes tried again because JetStream had no leader or NATS was reconnecting",
)
OUTAGE_GAVE_UP = Counter(
    "gpuledger_ledger_outage_gave_up_total",
    "Ledger reads and writes refused as unavailable after waiting out their whole window",
)
OUTAGE_WAITED = Histogram(
    "gpuledger_ledger_outage_wait_seconds",
    "How long a ledger read or write waited out an outage before it succeeded",
    buckets=(0.1, 0.25, 0.5, 1, 2, 4, 6, 8, 10, 15),
)
