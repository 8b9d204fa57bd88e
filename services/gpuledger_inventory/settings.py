"""The inventory's settings."""

from __future__ import annotations

import importlib.util
import socket
from dataclasses import dataclass

from gpuledger_common.kubeconfig import KubeClientSettings
from gpuledger_common.settings import SettingsError, computed_option, option, require
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD, MAX_SLOTS_PER_CARD
from gpuledger_inventory.faults import FaultPolicy, fault_policy

MODES = ("classic", "dra")  # how this node's pool is served (docs/dra.md)
POSITIVE = ("heartbeat_interval_s", "inventory_interval_s", "poll_interval_s", "nvml_retry_max_s", "dra_resync_s")


@dataclass(frozen=True, slots=True)
class InventorySettings(KubeClientSettings):
    """gpuledger-inventory: per-node GPU inventory and health. Kubernetes (kube) is for the Node's
    labels and, in DRA mode, the node's ResourceSlices."""

    node: str = computed_option(socket.gethostname, "the Node's name", shown="$NODE_NAME or the host name",
                                env=("NODE_NAME",))  # fmt: skip
    fake_fleet: str = option("", "a fleet file (docs/fleet-file.md): run on the fake NVML for this node")
    http_host: str = option("0.0.0.0", "address for /healthz, /readyz, /metrics")
    http_port: int = option(9402, "port for /healthz, /readyz, /metrics (0: any free port)")
    heartbeat_interval_s: float = option(5.0, "how often the heartbeat is published")
    inventory_interval_s: float = option(30.0, "how often the inventory is published even without a change")
    poll_interval_s: float = option(10.0, "how often memory and processes are read")
    proc_root: str = option(
        "/proc", "the host's /proc: each GPU process's pod from its cgroup (docs/audit.md; empty: not attributed)"
    )
    event_wait_ms: int = option(1000, "one NVML event wait (bounds how long a stop takes)")
    nvml_retry_max_s: float = option(30.0, "the longest wait between NVML re-initialisations")
    ignore_xids: frozenset[int] = option(
        frozenset(), "comma-separated XIDs that leave a card healthy: action application (docs/xid-policy.md)"
    )
    xid_actions: str = option("", "actions per XID over the catalog, e.g. 79=retire,13=drain (docs/xid-policy.md)")
    recover_on_nvml_return: bool = option(True, "rule nvml-returned: cards that failed only with NVML recover")
    recover_after_s: float = option(
        0.0, "rule recover-after: a no-new-work XID or ECC fault heals after this quiet time (0: off)"
    )
    state_file: str = option("", "the health book on disk (empty: a restart forgets)")
    mode: str = option("classic", "classic (the device plugin) or dra (also publish ResourceSlices; needs Kubernetes)")
    slots_per_card: int = option(DEFAULT_SLOTS_PER_CARD, "dra: the most claims sharing a card (1: never shared)")
    dra_memory_step_mib: int = option(256, "dra: the memory capacity's request step (and its minimum)")
    dra_binding_conditions: bool = option(
        True, "dra: kube-scheduler binds a claim's pod only once the ledger committed it"
    )
    dra_resync_s: float = option(30.0, "dra: how often the slices are read back and mended (kubelet deletes them)")
    remediate: bool = option(False, "repair failing cards: drain, reset, check, return or retire (docs/remediation.md)")
    reset_command: str = option("nvidia-smi --gpu-reset -i {uuid}", "remediate: resets a card ({uuid} {index} {bus_id})"
                                )  # fmt: skip
    reset_timeout_s: float = option(120.0, "remediate: a reset or probe running longer is killed")
    retire_window_s: float = option(3600.0, "remediate: a card that fails again this soon after coming back is retired")
    check_command: str = option("", "remediate: a probe run after NVML's check, e.g. a short allocation (empty: none)")
    mig_keep_s: float = option(
        60.0, "an on-demand MIG instance nobody holds is kept this long for reuse, then destroyed (docs/mig.md)"
    )
    log_level: str = option("info", "debug, info, warning or error")
    log_format: str = option("text", "text or json")
    stop_timeout_s: float = option(10.0, "how long each part may take to stop")

    def __post_init__(self) -> None:
        require(bool(self.node), "node", "is required (--node or GPULEDGER_NODE)")
        self.check_kube()
        for name in POSITIVE:
            require(getattr(self, name) > 0, name, f"must be positive, got {getattr(self, name)}")
        require(1 <= self.event_wait_ms <= 60000, "event_wait_ms", f"must be 1..60000, got {self.event_wait_ms}")
        require(0 <= self.http_port <= 65535, "http_port", f"must be 0..65535, got {self.http_port}")
        require(self.recover_after_s >= 0, "recover_after_s", "must not be negative")
        require(self.stop_timeout_s > 0, "stop_timeout_s", "must be positive")
        require(self.reset_timeout_s > 0, "reset_timeout_s", "must be positive")
        require(self.retire_window_s >= 0, "retire_window_s", "must not be negative")
        require(self.mig_keep_s >= 0, "mig_keep_s", f"must not be negative, got {self.mig_keep_s}")
        require(not self.remediate or bool(self.reset_command.strip()), "reset_command", "is required to remediate")
        self.faults()
        self._check_dra()
        levels = ("debug", "info", "warning", "error")
        require(self.log_level in levels, "log_level", "must be debug|info|warning|error")
        require(self.log_format in ("text", "json"), "log_format", "must be text|json")
        require(
            not self.fake_fleet or importlib.util.find_spec("gpuledger_dev") is not None,
            "fake_fleet",
            "needs the simulated fleet, which this install leaves out (the production image); "
            "use the image's dev target or install gpuledger with its test utilities",
        )

    def faults(self) -> FaultPolicy:
        """The fault policy: the XID catalog under ``xid_actions`` and ``ignore_xids``."""
        try:
            return fault_policy(self.ignore_xids, self.xid_actions)
        except ValueError as err:
            raise SettingsError(f"xid_actions: {err}") from None

    def _check_dra(self) -> None:
        require(self.mode in MODES, "mode", f"must be one of {'|'.join(MODES)}, got {self.mode!r}")
        require(
            self.mode != "dra" or self.kube != "off",
            "mode",
            "dra publishes ResourceSlices and needs Kubernetes (kube is off)",
        )
        require(1 <= self.slots_per_card <= MAX_SLOTS_PER_CARD, "slots_per_card", f"must be 1..{MAX_SLOTS_PER_CARD}")
        require(1 <= self.dra_memory_step_mib <= 65536, "dra_memory_step_mib", "must be 1..65536")
