"""A real node beside a real control plane: containerd (with runc, CNI and CDI) and kubelet v1.36.

Everything lives under one short work directory (unix socket paths are limited to 108 bytes):
containerd's root and state, kubelet's root directory (so its plugin-registry, DRA plugin and
PodResources sockets are there), the CNI configuration, the CDI spec directory, the pod logs and
every process's log. Two things kubelet keeps at fixed paths whatever its root directory: the
device manager's ``/var/lib/kubelet/device-plugins/`` (``kubelet.sock``, the checkpoint, the device
plugins' sockets), so one real node at a time runs on a machine, and the links it makes in
``/var/log/containers``; ``stop`` removes what the node put in both. The kubelet runs as root on this machine's cgroup
v1 hierarchies (``failCgroupV1: false``, the ``cgroupfs`` driver) under a cgroup root of its own,
authenticates with a client certificate for ``system:node:<name>`` (the API server's Node
authorizer and NodeRestriction apply to it) and serves with a certificate the API server checks,
so that ``kubectl logs`` and ``exec`` work. Images come from ``images`` (no registry).

``stop`` leaves nothing behind: it stops kubelet, kills and deletes every container through
containerd, stops containerd and its shims, unmounts whatever is still mounted under the work
directory, deletes the pod bridge and removes the cgroups; ``leftovers`` says what remains.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuledger_dev.controlplane.cluster import ControlPlane, ControlPlaneError, Process, advertise_address
from gpuledger_dev.natsserver import free_port
from gpuledger_dev.realnode.build import NodeBinaries, ensure_node_built
from gpuledger_dev.realnode.images import PAUSE_IMAGE, Images, ensure_images
from gpuledger_dev.realnode.residue import CONTAINER_LOGS_DIR, DEVICE_PLUGIN_DIR, Residue

READY_S = 120.0


class NodeError(RuntimeError):
    """The real node could not start or stop cleanly; the message names the step and its log."""


@dataclass
class RealNode:
    """kubelet and containerd for the node ``name``. Use ``with RealNode(control_plane) as node``."""

    control_plane: ControlPlane
    name: str = "real-0"
    topology_manager_policy: str = "none"
    workdir: Path | None = None
    bins: NodeBinaries | None = None
    images: Images | None = None
    processes: dict[str, Process] = field(default_factory=dict)
    node_ip: str = field(default_factory=advertise_address)
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    _made: list[Path] = field(default_factory=list)

    # --- where things are ---

    @property
    def root(self) -> Path:
        assert self.workdir is not None
        return self.workdir

    @property
    def kubelet_dir(self) -> Path:
        """kubelet's ``--root-dir``."""
        return self.root / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        """Where kubelet serves ``kubelet.sock`` and device plugins put theirs (fixed in kubelet)."""
        return DEVICE_PLUGIN_DIR

    @property
    def plugins_registry_dir(self) -> Path:
        """Where kubelet's plugin watcher looks for registration sockets (DRA plugins)."""
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        """Where DRA kubelet plugins put their service sockets (``<dir>/<driver>/``)."""
        return self.kubelet_dir / "plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / "pod-resources" / "kubelet.sock"

    @property
    def cdi_dir(self) -> Path:
        """The one directory containerd reads CDI specs from."""
        return self.root / "cdi"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/gpuledger-{self.name}-{self.token}"

    @property
    def bridge(self) -> str:
        return f"gl{self.token}"  # at most 15 characters, as Linux asks of interface names

    # --- start and stop ---

    def __enter__(self) -> RealNode:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise NodeError("a real node runs kubelet and containerd as root; run as root")
        self.bins = self.bins or ensure_node_built()
        self.images = self.images or ensure_images()
        if (self.device_plugin_dir / "kubelet.sock").exists():
            raise NodeError(
                f"{self.device_plugin_dir / 'kubelet.sock'} exists: another kubelet runs on this machine (or one "
                "crashed and left it); a real node needs kubelet's fixed device-plugin directory to itself"
            )
        self._made = [
            d for d in (self.device_plugin_dir.parent, self.device_plugin_dir, CONTAINER_LOGS_DIR) if not d.exists()
        ]
        self.workdir = self.workdir or Path(tempfile.mkdtemp(prefix="gl-node-", dir="/tmp"))
        for directory in (self.root / "logs", self.cdi_dir, self.device_plugin_dir, self.root / "pod-logs"):
            directory.mkdir(parents=True, exist_ok=True)
        self._start_containerd()
        self._import_images()
        self.residue.make_cgroup_root()
        self._start_kubelet()
        self.wait_ready()

    def stop(self) -> None:
        """Stop kubelet and containerd and remove what they left; raise if something remains."""
        if self.workdir is None:
            return
        kubelet = self.processes.pop("kubelet", None)
        if kubelet is not None:
            kubelet.stop(timeout=20)
        if "containerd" in self.processes:
            self._remove_containers()
        containerd = self.processes.pop("containerd", None)
        if containerd is not None:
            containerd.stop(timeout=20)
        residue = self.residue
        residue.kill_strays()
        residue.unmount_all()
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        residue.remove_cgroups()
        residue.remove_fixed_paths()
        left = residue.leftovers()
        if left:
            raise NodeError(f"the real node {self.name} left behind: " + "; ".join(left))

    def restart_kubelet(self) -> None:
        """Kill kubelet as a crash would and start it again with the same configuration."""
        old = self.processes.pop("kubelet", None)
        if old is not None:
            old.kill()
            old.stop()
        self._spawn("kubelet", self._kubelet_argv())

    def restart_containerd(self) -> None:
        """Stop containerd as an upgrade does and start it again; the shims keep the containers."""
        assert self.bins is not None
        old = self.processes.pop("containerd", None)
        if old is not None:
            old.stop(timeout=20)
        process = self._spawn("containerd", [str(self.bins.containerd), "--config", str(self.root / "containerd.toml")])
        self._wait(process, lambda: self._ctr_ok("version"), "containerd")

    # --- containerd ---

    def _start_containerd(self) -> None:
        assert self.bins is not None
        base = self.root / "containerd"
        config = self.root / "containerd.toml"
        config.write_text(self._containerd_config(base))
        self._write_cni_config()
        process = self._spawn("containerd", [str(self.bins.containerd), "--config", str(config)])
        self._wait(process, lambda: self._ctr_ok("version"), "containerd")

    def _containerd_config(self, base: Path) -> str:
        assert self.bins is not None
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        lines = [
            "version = 3",
            f"root = '{base / 'root'}'",
            f"state = '{base / 'state'}'",
            "disabled_plugins = ['io.containerd.nri.v1.nri']",
            "[grpc]",
            f"  address = '{self.containerd_socket}'",
            "[ttrpc]",
            f"  address = '{self.containerd_socket}.ttrpc'",
            "[plugins.'io.containerd.internal.v1.opt']",
            f"  path = '{base / 'opt'}'",
            "[plugins.'io.containerd.cri.v1.images']",
            "  snapshotter = 'overlayfs'",
            "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
            f"  sandbox = '{PAUSE_IMAGE}'",
            f"[{runtime}]",
            "  enable_cdi = true",
            f"  cdi_spec_dirs = ['{self.cdi_dir}']",
            "  netns_mounts_under_state_dir = true",
            # Root here lacks CAP_SYS_RESOURCE, so no process may lower its OOM score below
            # containerd's (kubelet asks -998 for sandboxes); containerd then clamps, as rootless does.
            "  restrict_oom_score_adj = true",
            f"[{runtime}.containerd]",
            "  default_runtime_name = 'runc'",
            f"[{runtime}.containerd.runtimes.runc]",
            "  runtime_type = 'io.containerd.runc.v2'",
            f"[{runtime}.containerd.runtimes.runc.options]",
            f"  BinaryName = '{self.bins.runc}'",
            f"  Root = '{base / 'runc'}'",
            "  SystemdCgroup = false",
            f"[{runtime}.cni]",
            f"  bin_dirs = ['{self.bins.cni_dir}']",
            f"  conf_dir = '{self.root / 'cni' / 'net.d'}'",
            "[plugins.'io.containerd.grpc.v1.cri']",
            "  stream_server_address = '127.0.0.1'",
        ]
        return "\n".join(lines) + "\n"

    def _write_cni_config(self) -> None:
        subnet = f"10.213.{int(self.token, 16) % 250}"
        conf = {
            "cniVersion": "1.0.0",
            "name": "gpuledger-real-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": f"{subnet}.0/24"}]],
                        "dataDir": str(self.root / "cni" / "ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }
        directory = self.root / "cni" / "net.d"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "10-gpuledger.conflist").write_text(json.dumps(conf, indent=2))

    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, in kubelet's namespace."""
        assert self.bins is not None
        cmd = [str(self.bins.ctr), "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-800:]}")
        return done

    def _ctr_ok(self, *args: str) -> bool:
        try:
            return self.ctr(*args, check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _import_images(self) -> None:
        assert self.images is not None
        for archive in (self.images.pause, self.images.workload):
            self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive), timeout=300)

    def _remove_containers(self) -> None:
        """Kill and delete every container kubelet's namespace holds (what a crashed kubelet left)."""
        with contextlib.suppress(NodeError, subprocess.TimeoutExpired):
            tasks = self.ctr("tasks", "list", "--quiet", check=False).stdout.split()
            for task in tasks:
                self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
            for task in tasks:
                self.ctr("tasks", "delete", "--force", task, check=False)
            for container in self.ctr("containers", "list", "--quiet", check=False).stdout.split():
                self.ctr("containers", "delete", container, check=False)

    # --- kubelet ---

    def _start_kubelet(self) -> None:
        access = self.control_plane.access
        pki = self.control_plane.pki
        if access is None or pki is None:
            raise NodeError("the control plane is not started")
        client_cert, client_key = pki.issue(
            f"kubelet-{self.name}-client", f"system:node:{self.name}", ("system:nodes",), client=True
        )
        serving_cert, serving_key = pki.issue(
            f"kubelet-{self.name}-serving", f"system:node:{self.name}", hosts=(self.node_ip, "127.0.0.1", self.name)
        )
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "e2e", "cluster": {"server": access.server, "certificate-authority": str(pki.ca_cert)}}
            ],
            "users": [
                {"name": "kubelet", "user": {"client-certificate": str(client_cert), "client-key": str(client_key)}}
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "kubelet"}}],
            "current-context": "e2e",
        }
        (self.root / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        (self.root / "kubelet.yaml").write_text(yaml.safe_dump(self._kubelet_config(serving_cert, serving_key)))
        self._spawn("kubelet", self._kubelet_argv())

    def _kubelet_config(self, serving_cert: Path, serving_key: Path) -> dict[str, Any]:
        assert self.control_plane.pki is not None
        self.kubelet_port = free_port()
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "tlsCertFile": str(serving_cert),
            "tlsPrivateKeyFile": str(serving_key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.control_plane.pki.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "podLogsDir": str(self.root / "pod-logs"),
            "maxPods": 30,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "topologyManagerPolicy": self.topology_manager_policy,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "serializeImagePulls": False,
            "resolvConf": "",
        }

    def _kubelet_argv(self) -> list[str]:
        assert self.bins is not None
        return [
            str(self.bins.kubelet),
            "--config",
            str(self.root / "kubelet.yaml"),
            "--kubeconfig",
            str(self.root / "kubelet.kubeconfig"),
            "--root-dir",
            str(self.kubelet_dir),
            "--hostname-override",
            self.name,
            "--node-ip",
            self.node_ip,
            "--v=2",
        ]

    def node(self) -> dict[str, Any]:
        found = self.control_plane.request("GET", f"/api/v1/nodes/{self.name}")
        assert isinstance(found, dict)
        return found

    def ready(self) -> bool:
        try:
            conditions = self.node().get("status", {}).get("conditions", [])
        except ControlPlaneError:
            return False
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def wait_ready(self, timeout: float = READY_S) -> None:
        self._wait(self.processes["kubelet"], self.ready, f"Node {self.name} Ready", timeout)

    # --- processes ---

    def _spawn(self, name: str, argv: list[str]) -> Process:
        assert self.bins is not None
        path = f"{self.bins.runtime_dir}:{self.bins.runc.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        process = Process(name, argv, self.root / "logs" / f"{name}.log", {**os.environ, "PATH": path})
        process.start()
        self.processes[name] = process
        return process

    def _wait(self, process: Process, ready: Any, what: str, timeout: float = READY_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process.alive():
                raise NodeError(f"{process.name} exited while waiting for {what}; its log ends:\n{process.tail()}")
            if ready():
                return
            time.sleep(0.3)
        raise NodeError(f"{what} not within {timeout:g}s; {process.name}'s log ends:\n{process.tail(60)}")

    @property
    def residue(self) -> Residue:
        return Residue(self.root, self.cgroup_root, self.bridge, self.device_plugin_dir, self._made)

    def leftovers(self) -> list[str]:
        """What this node still holds on the machine (``Residue.leftovers``)."""
        return self.residue.leftovers() if self.workdir is not None else []

    def remove_workdir(self) -> None:
        """Delete the work directory (logs included); only once nothing is mounted under it."""
        if self.workdir is not None and not self.residue.mounts():
            shutil.rmtree(self.workdir, ignore_errors=True)
