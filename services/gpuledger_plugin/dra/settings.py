"""Settings of the plugin shim in DRA mode (``gpuledger-plugin --mode dra``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuledger_common.kubeconfig import KubeClientSettings
from gpuledger_common.settings import option, require
from gpuledger_plugin.mig_answer import MIG_MINORS_FILE

DRIVER = "gpu.gpuledger.io"
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, slots=True)
class DraSettings(KubeClientSettings):
    """gpuledger-plugin --mode dra: the kubelet DRA plugin of driver gpu.gpuledger.io. It reads
    claims from the API server: it needs Kubernetes (kube)."""

    mode: str = option("dra", "dra (classic mode takes the device plugin's settings)")
    node: str = option("", "this node's name: its ResourceSlice pool (required)")
    driver: str = option(DRIVER, "the DRA driver name (the DeviceClass and the inventory's slices use it)")
    registry_dir: str = option("/var/lib/kubelet/plugins_registry", "kubelet's plugin registration directory")
    plugin_dir: str = option("/var/lib/kubelet/plugins", "where the plugin's own socket goes (<dir>/<driver>/dra.sock)")
    cdi_dir: str = option("/var/run/cdi", "where the claims' CDI specs are written (the runtime's CDI spec dir)")
    ledger_check: bool = option(
        True, "prepare a claim only if the ledger holds it (placement's claims controller wrote it; over NATS)"
    )
    mps_pipe_dir: str = option("/tmp/nvidia-mps", "CUDA_MPS_PIPE_DIRECTORY inside containers of mps claims")
    mps_host_pipe_dir: str = option("/run/nvidia/mps", "the MPS daemon's pipe directory on the host")
    mps_host_shm_dir: str = option(
        "", "the MPS daemon's /dev/shm on the host, mounted at /dev/shm for mps claims (empty: not mounted)"
    )
    device_dir: str = option(
        "/dev",
        "the host directory holding the cards' device nodes; the CDI specs name them there (as hostPath) "
        "and at /dev in the container",
    )
    mig_minors_file: str = option(
        MIG_MINORS_FILE,
        "the driver's MIG minors file: the capability device nodes a MIG placement's CDI spec names "
        "(where it is missing, none)",
    )
    api_timeout_s: float = option(10.0, "the longest one API server call may take")
    prepare_timeout_s: float = option(40.0, "the longest one claim's prepare may take (kubelet waits 45 s)")
    socket_poll_s: float = option(1.0, "how often to check that the registration socket is still there")
    health_resend_s: float = option(
        10.0, "how often kubelet's device health stream hears the devices' health again though nothing changed"
    )
    health_timeout_s: int = option(
        30, "how long kubelet trusts a device's health without hearing it again (then shows Unknown)"
    )
    http_host: str = option("0.0.0.0", "address for /healthz, /readyz, /metrics")
    http_port: int = option(8083, "port for /healthz, /readyz, /metrics (0: any free port)")
    log_level: str = option("info", "debug, info, warning or error")
    log_format: str = option("text", "text or json")

    def __post_init__(self) -> None:
        require(self.mode == "dra", "mode", f"must be dra here, got {self.mode!r}")
        require(bool(self.node), "node", "is required (the Kubernetes node name)")
        self.check_kube()
        require(self.kube != "off", "kube", "the DRA plugin reads claims from the API server and needs Kubernetes")
        require(
            len(self.driver) <= 63 and bool(_DNS_SUBDOMAIN.fullmatch(self.driver)),
            "driver",
            "must be a DNS subdomain of at most 63 characters",
        )
        paths = ("registry_dir", "plugin_dir", "cdi_dir", "mps_pipe_dir", "mps_host_pipe_dir", "device_dir")
        for name in (*paths, "mig_minors_file"):
            require(getattr(self, name).startswith("/"), name, "must be an absolute path")
        for name in ("api_timeout_s", "prepare_timeout_s", "socket_poll_s", "health_resend_s"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(
            self.health_timeout_s > self.health_resend_s,
            "health_timeout_s",
            f"must be longer than health_resend_s ({self.health_resend_s:g}), or kubelet sees Unknown between sends",
        )
        shm = self.mps_host_shm_dir
        require(not shm or shm.startswith("/"), "mps_host_shm_dir", "must be an absolute path (or empty)")
        require(0 <= self.http_port < 65536, "http_port", "must be 0..65535")
        require(self.log_format in ("text", "json"), "log_format", "must be text or json")
        require(self.log_level in ("debug", "info", "warning", "error"), "log_level", "bad level")

    @property
    def registration_socket(self) -> str:
        return f"{self.registry_dir.rstrip('/')}/{self.driver}-reg.sock"

    @property
    def dra_socket(self) -> str:
        return f"{self.plugin_dir.rstrip('/')}/{self.driver}/dra.sock"


def wants_dra(argv: Sequence[str] | None, env: Mapping[str, str]) -> bool:
    """``--mode dra`` (or ``--mode=dra``) on the command line, else ``GPULEDGER_MODE=dra``."""
    args = list(argv or ())
    for i, arg in enumerate(args):
        if arg == "--mode" and i + 1 < len(args):
            return args[i + 1] == "dra"
        if arg.startswith("--mode="):
            return arg.partition("=")[2] == "dra"
    return env.get("GPULEDGER_MODE", "") == "dra"
