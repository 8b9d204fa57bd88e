"""Prometheus metrics shared by the services (each service adds its own beside these)."""

from __future__ import annotations

from prometheus_client import Counter

CAS_ATTEMPTS = Counter("gpuledger_ledger_cas_attempts_total", "Compare-and-set writes tried on the ledger")
CAS_CONFLICTS = Counter(
    "gpuledger_ledger_cas_conflicts_total", "Compare-and-set writes that lost a race and were retried"
)
CAS_GAVE_UP = Counter(
    "gpuledger_ledger_cas_gave_up_total", "Ledger changes abandoned after the bounded number of retries"
)
