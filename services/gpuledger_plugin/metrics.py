"""The plugin shim's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ALLOCATE_SECONDS = Histogram(
    "gpuledger_plugin_allocate_seconds",
    "Time to answer kubelet's Allocate",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
PREFERRED_SECONDS = Histogram(
    "gpuledger_plugin_preferred_allocation_seconds",
    "Time to answer kubelet's GetPreferredAllocation",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
ANSWERS = Counter(
    "gpuledger_plugin_answers_total",
    "kubelet calls answered, by call and outcome",
    ["call", "outcome"],
)
IDENTITY = Counter(
    "gpuledger_plugin_identity_total",
    "How the container being admitted was identified (exact, steered, rehomed, guessed, refused)",
    ["how"],
)
RECONCILE_MISMATCHES = Counter(
    "gpuledger_plugin_reconcile_mismatches_total",
    "Differences between the ledger and what kubelet recorded, by kind",
    ["kind"],
)
RECONCILE_REPAIRS = Counter(
    "gpuledger_plugin_reconcile_repairs_total",
    "Mismatches repaired in the ledger, by kind and outcome",
    ["kind", "outcome"],
)
REGISTRATIONS = Counter("gpuledger_plugin_registrations_total", "Registrations with kubelet, by outcome", ["outcome"])
DEVICES = Gauge("gpuledger_plugin_devices", "Devices advertised to kubelet, by health", ["health"])

UNBOUND_LOST = Counter(
    "gpuledger_plugin_unbound_lost_total",
    "Containers admitted from the node's last known ledger whose reservation was gone when the ledger came back",
)
MIG_MADE = Counter(
    "gpuledger_plugin_mig_instances_total",
    "MIG instances asked of the node's inventory at Allocate: made (or found), or failed (the allocation released)",
    ["outcome"],
)
MIG_DEVICES = Gauge("gpuledger_plugin_mig_devices", "Devices advertised to kubelet per MIG resource", ["resource"])
