"""Prometheus metrics of gpuledger-inventory (served on /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

NVML_UP = Gauge("gpuledger_inventory_nvml_up", "1 while NVML answers, 0 while it fails")
NVML_FAILURES = Counter(
    "gpuledger_inventory_nvml_failures_total", "Times NVML failed and was re-initialised"
)
CARDS = Gauge("gpuledger_inventory_cards", "Cards found by the last scan")
CARD_HEALTHY = Gauge(
    "gpuledger_inventory_card_healthy", "1 if the card is healthy", ["uuid", "index", "model"]
)
CARD_PROCESSES = Gauge(
    "gpuledger_inventory_card_processes", "Compute processes NVML sees on the card", ["uuid"]
)
CARD_PROCESS_MEMORY = Gauge(
    "gpuledger_inventory_card_process_memory_mib",
    "Device memory those processes use (MiB)",
    ["uuid"],
)
CARD_MEMORY_USED = Gauge(
    "gpuledger_inventory_card_memory_used_mib", "Device memory in use (MiB)", ["uuid"]
)
HEALTH_EVENTS = Counter(
    "gpuledger_inventory_health_events_total", "Health events from NVML", ["kind", "acted"]
)
TRANSITIONS = Counter(
    "gpuledger_inventory_health_transitions_total", "Card health changes", ["health", "by"]
)
SCAN_SECONDS = Histogram(
    "gpuledger_inventory_scan_seconds",
    "Time of a full scan (cards and topology)",
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PUBLISHED = Counter("gpuledger_inventory_published_total", "Messages published", ["kind"])
PUBLISH_ERRORS = Counter(
    "gpuledger_inventory_publish_errors_total", "Publishes that failed", ["kind"]
)
LABEL_PATCHES = Counter(
    "gpuledger_inventory_label_patches_total", "Node label patches sent to Kubernetes"
)
LABEL_ERRORS = Counter("gpuledger_inventory_label_errors_total", "Node label updates that failed")
SLICE_WRITES = Counter(
    "gpuledger_inventory_slice_writes_total", "DRA mode: pool generations written as ResourceSlices"
)
SLICE_ERRORS = Counter(
    "gpuledger_inventory_slice_errors_total",
    "DRA mode: ResourceSlice writes that failed or that the API server did not keep as sent",
)
REMEDIATION_STEPS = Counter(
    "gpuledger_inventory_remediation_steps_total",
    "Cards entering a remediation stage (faulted, quarantined, drained, resetting, checking, serving, retired)",
    ["stage"],
)
_REPAIR_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
FAULT_TO_DRAINED = Histogram(
    "gpuledger_inventory_fault_to_drained_seconds",
    "From a card's fault to its last holder and process gone",
    buckets=_REPAIR_BUCKETS,
)
FAULT_TO_BACK = Histogram(
    "gpuledger_inventory_fault_to_back_seconds",
    "From a card's fault to back in service after its repair and check (time to repair)",
    buckets=_REPAIR_BUCKETS,
)
RETIRED_CARDS = Gauge("gpuledger_inventory_retired_cards", "Cards retired until an operator acts")
MIG_CHANGES = Counter(
    "gpuledger_inventory_mig_changes_total",
    "MIG instances made on demand, destroyed once unheld for the keep, or reclaimed for a placement over them",
    ["change"],
)
