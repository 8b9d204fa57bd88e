"""The plugin shim's settings."""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger_common.inventory_api import MAKE_TIMEOUT_S
from gpuledger_common.natscreds import NatsClientSettings
from gpuledger_common.settings import option, require
from gpuledger_common.store.outage import RETRY_S
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD, MAX_SLOTS_PER_CARD
from gpuledger_plugin.answer import CDI_SPEC_DIRS, STRATEGIES
from gpuledger_plugin.kubelet_findings import GONE_AFTER_S
from gpuledger_plugin.mig_answer import MIG_MINORS_FILE
from gpuledger_plugin.mig_resources import GPU_RESOURCE
from gpuledger_plugin.waits import ALLOCATE_WAIT_S, PREFERRED_WAIT_S, UNREACHABLE_WAIT_S

RESOURCE_NAME = GPU_RESOURCE


@dataclass(frozen=True, slots=True)
class PluginSettings(NatsClientSettings):
    """gpuledger-plugin: the kubelet device plugin that hands containers their ledger cards."""

    node: str = option("", "this node's name, as in the ledger (required)")
    device_plugin_dir: str = option("/var/lib/kubelet/device-plugins", "kubelet's device-plugin directory")
    socket_name: str = option(
        "gpuledger.sock",
        "the plugin's socket file in the device-plugin dir (gpuledger.io/gpu's; each MIG resource's is "
        "beside it: gpuledger-mig.sock, gpuledger-mig-<profile>.sock)",
    )
    pod_resources_socket: str = option("/var/lib/kubelet/pod-resources/kubelet.sock", "kubelet's PodResources socket")
    slots_per_card: int = option(DEFAULT_SLOTS_PER_CARD, "kubelet devices advertised per card (containers sharing it)")
    device_list_strategy: str = option(
        "volume-mounts",
        "how containers are given their cards, a comma list of volume-mounts (default: /dev/null mounts under "
        "/var/run/nvidia-container-devices, which a pod cannot forge), cdi-cri, cdi-annotations, or env "
        "(NVIDIA_VISIBLE_DEVICES: any pod can set it itself; only where the container toolkit ignores it for "
        "unprivileged containers)",
    )
    cdi_kind: str = option("nvidia.com/gpu", "CDI vendor/class of the card devices")
    cdi_spec_dirs: str = option(
        ",".join(CDI_SPEC_DIRS),
        "the container runtime's CDI spec directories, comma-separated: Allocate refuses CDI devices no "
        "spec there defines (cdi-cri, cdi-annotations)",
    )
    device_specs: bool = option(False, "also pass /dev/nvidia* device nodes in Allocate answers")
    device_dir: str = option(
        "/dev",
        "the host directory holding the cards' device nodes (nvidia<minor>, nvidiactl, nvidia-uvm); "
        "containers see them under /dev whatever it is",
    )
    mig_minors_file: str = option(
        MIG_MINORS_FILE,
        "the driver's MIG capability minors; with device_specs, a MIG instance's GPU and compute instance "
        "access nodes (/dev/nvidia-caps/nvidia-cap<minor>) are passed where it exists",
    )
    mig_make_timeout_s: float = option(
        MAKE_TIMEOUT_S,
        "how long Allocate waits for the node's inventory to make one MIG instance (answer_timeout_s bounds "
        "the whole call; one cut short while making releases the allocation)",
    )
    default_isolation: str = option("none", "isolation for shared cards that asked for none: none or mps")
    mps_pipe_dir: str = option("/tmp/nvidia-mps", "CUDA_MPS_PIPE_DIRECTORY inside containers")
    mps_host_pipe_dir: str = option("/run/nvidia/mps", "the MPS daemon's pipe directory on the host")
    mps_host_shm_dir: str = option(
        "", "the MPS daemon's /dev/shm on the host, mounted at /dev/shm in MPS containers (empty: not mounted)"
    )
    answer_timeout_s: float = option(
        30.0, "the longest any kubelet call waits for NATS or the ledger (a NATS restart is ridden out)"
    )
    ledger_retry_s: float = option(
        RETRY_S,
        "how long one ledger read or write waits out a JetStream outage (a leader election) before the "
        "call reads again (GetPreferredAllocation and Allocate keep trying until answer_timeout_s)",
    )
    placement_timeout_s: float = option(0.2, "how long GetPreferredAllocation waits for placement")
    allocate_wait_s: float = option(
        ALLOCATE_WAIT_S,
        "how long Allocate waits for the ledger while a NATS server answers (a leader election takes 4-10 s) "
        "before it admits a container whose reservation the node's last known ledger holds, binding it when "
        "the ledger is back; with no such reservation it then fails with the reason",
    )
    unreachable_wait_s: float = option(
        UNREACHABLE_WAIT_S,
        "how long GetPreferredAllocation and Allocate wait for a ledger that answers nothing, not even "
        "'not now' as JetStream does while it elects a leader, before they go on without it as above",
    )
    preferred_wait_s: float = option(
        PREFERRED_WAIT_S,
        "how long GetPreferredAllocation waits for the ledger before it steers from the node's last known "
        "ledger (kubelet fails the pod on any error there; Allocate checks the hint against the ledger)",
    )
    pod_resources_timeout_s: float = option(1.0, "how long to wait for kubelet's PodResources List")
    reconcile_interval_s: float = option(30.0, "how often to compare the ledger with kubelet")
    gone_after_s: float = option(
        GONE_AFTER_S,
        "how long kubelet must not list a pod that holds a bound allocation, seen so in two reconcile "
        "rounds at least this far apart, before the plugin releases the allocation (a restarted "
        "kubelet lists its pods again within seconds)",
    )
    kubelet_poll_s: float = option(0.2, "how often to look for a restarted kubelet (one stat of kubelet.sock)")
    http_host: str = option("0.0.0.0", "address for /healthz, /readyz, /metrics")
    http_port: int = option(8083, "port for /healthz, /readyz, /metrics (0: any free port)")
    log_level: str = option("info", "debug, info, warning or error")
    log_format: str = option("text", "text or json")

    def __post_init__(self) -> None:
        require(bool(self.node), "node", "is required (the Kubernetes node name)")
        self.check_nats()
        require(
            1 <= self.slots_per_card <= MAX_SLOTS_PER_CARD,
            "slots_per_card",
            f"must be 1..{MAX_SLOTS_PER_CARD}",
        )
        require(
            "/" not in self.socket_name and self.socket_name.endswith(".sock"),
            "socket_name",
            "must be a file name ending in .sock",
        )
        require(bool(self.strategies), "device_list_strategy", "must name at least one strategy")
        for strategy in self.strategies:
            require(
                strategy in STRATEGIES,
                "device_list_strategy",
                f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}",
            )
        require(
            not ({"env", "volume-mounts"} <= set(self.strategies)),
            "device_list_strategy",
            "env and volume-mounts both set NVIDIA_VISIBLE_DEVICES: choose one",
        )
        for name in ("mps_pipe_dir", "mps_host_pipe_dir", "mps_host_shm_dir"):
            path = getattr(self, name)
            require(not path or path.startswith("/"), name, f"must be an absolute path, got {path!r}")
        require(self.device_dir.startswith("/"), "device_dir", f"must be an absolute path, got {self.device_dir!r}")
        require("/" in self.cdi_kind, "cdi_kind", "must be vendor/class, e.g. nvidia.com/gpu")
        relative = [d for d in self.cdi_dirs if not d.startswith("/")]
        require(bool(self.cdi_dirs), "cdi_spec_dirs", "name at least one directory")
        require(not relative, "cdi_spec_dirs", f"must be absolute paths, got {relative}")
        require(self.default_isolation in ("none", "mps"), "default_isolation", "must be none or mps")
        for name in (
            "answer_timeout_s",
            "placement_timeout_s",
            "pod_resources_timeout_s",
            "preferred_wait_s",
            "allocate_wait_s",
            "unreachable_wait_s",
            "mig_make_timeout_s",
        ):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.mig_minors_file.startswith("/"), "mig_minors_file", "must be an absolute path")
        for name in ("preferred_wait_s", "allocate_wait_s"):
            wait = getattr(self, name)
            limit = self.answer_timeout_s
            require(wait < limit, name, f"must be below answer_timeout_s ({limit:g}), got {wait:g}")
        require(self.reconcile_interval_s > 0, "reconcile_interval_s", "must be positive")
        require(self.gone_after_s >= 0, "gone_after_s", "must not be negative")
        require(0 <= self.ledger_retry_s <= 60, "ledger_retry_s", "must be 0..60 seconds")
        require(self.kubelet_poll_s > 0, "kubelet_poll_s", "must be positive")
        require(0 <= self.http_port < 65536, "http_port", "must be 0..65535")
        require(self.log_format in ("text", "json"), "log_format", "must be text or json")
        require(self.log_level in ("debug", "info", "warning", "error"), "log_level", "bad level")

    @property
    def cdi_dirs(self) -> tuple[str, ...]:
        return tuple(d.strip() for d in self.cdi_spec_dirs.split(",") if d.strip())

    @property
    def strategies(self) -> tuple[str, ...]:
        return tuple(s.strip() for s in self.device_list_strategy.split(",") if s.strip())

    @property
    def kubelet_socket(self) -> str:
        return f"{self.device_plugin_dir.rstrip('/')}/kubelet.sock"

    @property
    def plugin_socket(self) -> str:
        return f"{self.device_plugin_dir.rstrip('/')}/{self.socket_name}"
