"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler (with gpuledger's extender configuration) and kwok managing the nodes (or, for a
real node, no kwok: ``gpuledger_dev.realnode``).

Everything listens on 127.0.0.1 on free ports; every process logs to its own file under the work
directory, and a process that dies while starting fails with its log's tail. ``ControlPlane`` is a
context manager (synchronous, so a pytest session fixture and ``gpuledger dev up`` can both hold one).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any

import yaml

from gpuledger_dev import children
from gpuledger_dev.controlplane.build import Binaries, ensure_built
from gpuledger_dev.controlplane.pki import Pki, make_pki
from gpuledger_dev.natsserver import free_port

ADMIN_TOKEN_USER = "gpuledger-e2e-admin"
# The claims of templates, namespaces and owners cleaned up, and ReplicaSets (the pods defragmentation
# moves are recreated by their controller).
DEFAULT_CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "resourceclaim-controller",
    "replicaset-controller",
)
PROFILING = "GPULEDGER_APISERVER_PROFILING"  # "1": kube-apiserver serves /debug/pprof (benchmarks only)
SERVICE_CIDR = "10.96.0.0/16"  # only written into Services; nothing here dials it
KWOK_CIDR = "198.51.100.0/24"  # pod IPs kwok writes into statuses (a documentation range)
STARTUP_S = 90.0
KWOK_NODE_LABEL = ("type", "kwok")  # kwok plays the Nodes with this label (and their pods), no other
SCHEDULER_CONFIG = Path("deploy") / "scheduler" / "scheduler-config.yaml"


class ControlPlaneError(RuntimeError):
    """A control-plane process failed to start or died; the message carries its log's tail."""


def advertise_address() -> str:
    """A non-loopback IPv4 address of this host (kube-apiserver refuses loopback there).

    The API server only writes it into the ``kubernetes`` Service's endpoints; nothing dials it.
    """
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout
        for line in out.splitlines():
            parts = line.split()
            if "inet" in parts:
                return parts[parts.index("inet") + 1].split("/")[0]
    return "192.0.2.1"  # TEST-NET-1: an address that routes nowhere, good enough to be written down


@dataclass
class Process:
    name: str
    argv: list[str]
    log_path: Path
    env: Mapping[str, str] | None = None  # the environment it starts with (None: this process's)
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        # Its own process group (a kill reaches whatever it starts), and it dies with this process.
        self.popen = children.popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env
        )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def check(self) -> None:
        if not self.alive():
            code = None if self.popen is None else self.popen.returncode
            raise ControlPlaneError(f"{self.name} exited ({code}); its log ({self.log_path}) ends:\n{self.tail()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            assert self.popen is not None
            os.killpg(self.popen.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            assert self.popen is not None
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass(frozen=True, slots=True)
class Access:
    """How a client reaches the API server."""

    server: str
    ca_pem: bytes
    token: str

    def kubeconfig(self, path: Path, user: str = "admin") -> Path:
        import base64

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpuledger-e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(self.ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": self.token}}],
            "contexts": [{"name": "gpuledger-e2e", "context": {"cluster": "gpuledger-e2e", "user": user}}],
            "current-context": "gpuledger-e2e",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path


@dataclass
class ControlPlane:
    """The control plane's processes and how to reach them. Use ``with ControlPlane(workdir) as cp``."""

    workdir: Path
    controllers: Sequence[str] = DEFAULT_CONTROLLERS
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    runtime_config: Sequence[str] = ()
    bins: Binaries | None = None
    kwok: bool = True  # kwok plays the Nodes labelled KWOK_NODE_LABEL
    processes: dict[str, Process] = field(default_factory=dict)
    access: Access | None = None
    pki: Pki | None = None
    admin_kubeconfig: Path | None = None

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # --- start and stop ---

    def start(self) -> None:
        self.bins = self.bins or ensure_built()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.pki = make_pki(self.workdir / "pki")
        self._start_etcd()
        self._start_apiserver()
        self._start_controller_manager()
        if self.kwok:
            self._start_kwok()

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()

    def _spawn(self, name: str, argv: list[str]) -> Process:
        process = Process(name, argv, self.workdir / "logs" / f"{name}.log")
        process.start()
        self.processes[name] = process
        return process

    def _start_etcd(self) -> None:
        assert self.bins is not None
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        process = self._spawn(
            "etcd",
            [
                str(self.bins.etcd),
                "--name",
                "e2e",
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                self.etcd_url,
                "--advertise-client-urls",
                self.etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"e2e=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
                "--quota-backend-bytes",
                str(4 << 30),
            ],
        )
        self._wait(process, lambda: _http_ok(f"{self.etcd_url}/health"), "etcd /health")

    def _start_apiserver(self) -> None:
        assert self.bins is not None and self.pki is not None
        port = free_port()
        admin = os.urandom(16).hex()
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(f'{admin},{ADMIN_TOKEN_USER},{ADMIN_TOKEN_USER},"system:masters"\n')
        tokens.chmod(0o600)
        argv = [
            str(self.bins.kube_apiserver),
            "--etcd-servers",
            self.etcd_url,
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            str(port),
            "--advertise-address",
            advertise_address(),
            "--tls-cert-file",
            str(self.pki.server_cert),
            "--tls-private-key-file",
            str(self.pki.server_key),
            "--client-ca-file",
            str(self.pki.ca_cert),
            "--service-account-issuer",
            "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file",
            str(self.pki.sa_key),
            "--service-account-signing-key-file",
            str(self.pki.sa_key),
            "--token-auth-file",
            str(tokens),
            # As a cluster authorizes its kubelets: the Node authorizer and NodeRestriction for
            # system:node:<name> users (a real node's kubelet), RBAC for everyone else.
            "--authorization-mode",
            "Node,RBAC",
            "--enable-admission-plugins",
            "NodeRestriction",
            "--kubelet-client-certificate",
            str(self.pki.kubelet_client_cert),
            "--kubelet-client-key",
            str(self.pki.kubelet_client_key),
            "--kubelet-certificate-authority",
            str(self.pki.ca_cert),
            "--kubelet-preferred-address-types",
            "InternalIP",
            "--service-cluster-ip-range",
            SERVICE_CIDR,
            "--allow-privileged=true",
            # Off, as a hardened cluster runs it; benchmarks/dra_throughput.py --pprof turns it on to
            # read where kube-apiserver's CPU goes (GET /debug/pprof/profile, as the admin).
            f"--profiling={'true' if os.environ.get(PROFILING) == '1' else 'false'}",
            # No controller here creates default ServiceAccounts or lifts not-ready taints.
            "--disable-admission-plugins",
            "ServiceAccount,TaintNodesByCondition",
        ]
        if self.feature_gates:
            argv += ["--feature-gates", _gates(self.feature_gates)]
        if self.runtime_config:
            argv += ["--runtime-config", ",".join(self.runtime_config)]
        process = self._spawn("kube-apiserver", argv)
        self.access = Access(f"https://127.0.0.1:{port}", self.pki.ca_pem(), admin)
        self.admin_kubeconfig = self.access.kubeconfig(self.workdir / "admin.kubeconfig")
        self._wait(process, lambda: self._api_ok("/readyz"), "kube-apiserver /readyz")

    def start_controller_manager(self, qps: tuple[int, int] | None = None) -> Process:
        """Start kube-controller-manager again, its client limited to ``qps`` (queries per second,
        burst) instead of its defaults (20, 30): kube-controller-manager creates the claim of every
        pod with a ResourceClaimTemplate, so its limit bounds the rate of such pods."""
        old = self.processes.pop("kube-controller-manager", None)
        if old is not None:
            old.stop()
        process = self._start_controller_manager(qps)
        assert process is not None, "no controllers to run"
        return process

    def _start_controller_manager(self, qps: tuple[int, int] | None = None) -> Process | None:
        assert self.bins is not None and self.admin_kubeconfig is not None
        if not self.controllers:
            return None
        argv = [
            str(self.bins.kube_controller_manager),
            "--kubeconfig",
            str(self.admin_kubeconfig),
            "--controllers",
            ",".join(self.controllers),
            "--leader-elect=false",
            "--secure-port=0",
        ]
        if qps is not None:
            argv += ["--kube-api-qps", str(qps[0]), "--kube-api-burst", str(qps[1])]
        if self.feature_gates:
            argv += ["--feature-gates", _gates(self.feature_gates)]
        process = self._spawn("kube-controller-manager", argv)
        self._wait(process, lambda: True, "kube-controller-manager")
        return process

    def _start_kwok(self) -> None:
        assert self.bins is not None and self.admin_kubeconfig is not None
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text(resources.files("gpuledger_dev.controlplane").joinpath("stages.yaml").read_text())
        argv = [
            str(self.bins.kwok),
            "--kubeconfig",
            str(self.admin_kubeconfig),
            "--config",
            str(stages),
            # Only the Nodes made for it: a real kubelet's Node is its own.
            "--manage-all-nodes=false",
            "--manage-nodes-with-label-selector",
            "=".join(KWOK_NODE_LABEL),
            "--cidr",
            KWOK_CIDR,
            "--node-ip",
            "198.51.100.1",
            "--server-address",
            f"127.0.0.1:{free_port()}",
        ]
        process = self._spawn("kwok", argv)
        self._wait(process, lambda: True, "kwok")

    def start_scheduler(self, name: str, config: Mapping[str, Any]) -> Process:
        """Start a kube-scheduler with ``config`` (a KubeSchedulerConfiguration, as a dict).

        Leader election is turned off and the client connection pointed at this API server.
        """
        assert self.bins is not None and self.admin_kubeconfig is not None
        doc = dict(config)
        doc["leaderElection"] = {"leaderElect": False}
        doc["clientConnection"] = {"kubeconfig": str(self.admin_kubeconfig), "qps": 500, "burst": 1000}
        path = self.workdir / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(doc))
        old = self.processes.pop(name, None)
        if old is not None:
            old.stop()
        argv = [str(self.bins.kube_scheduler), "--config", str(path), "--secure-port=0", "-v=2"]
        if self.feature_gates:
            argv += ["--feature-gates", _gates(self.feature_gates)]
        process = self._spawn(name, argv)
        self._wait(process, lambda: True, name)
        return process

    def _wait(self, process: Process, ready: Any, what: str, timeout: float = STARTUP_S) -> None:
        deadline = time.monotonic() + timeout
        settle = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            process.check()
            if time.monotonic() >= settle and ready():
                return
            time.sleep(0.1)
        raise ControlPlaneError(f"{what} not ready within {timeout:g}s; {process.name}'s log ends:\n{process.tail()}")

    # --- talking to it ---

    def _ssl(self) -> ssl.SSLContext:
        assert self.access is not None
        return ssl.create_default_context(cadata=self.access.ca_pem.decode())

    def _api_ok(self, path: str) -> bool:
        try:
            self.request("GET", path)
        except (OSError, ControlPlaneError):
            return False
        return True

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """One call to the API server as the admin; the decoded JSON answer (or text)."""
        assert self.access is not None
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.access.server}{path}",
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.access.token}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=30) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as err:
            raise ControlPlaneError(f"{method} {path}: {err.code} {err.read().decode(errors='replace')[:500]}") from err
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def kubectl(
        self, *args: str, check: bool = True, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this API server as the admin."""
        assert self.bins is not None and self.admin_kubeconfig is not None
        done = subprocess.run(
            [str(self.bins.kubectl), "--kubeconfig", str(self.admin_kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
            input=input_text,
            check=False,
        )
        if check and done.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done


def find_scheduler_config() -> Path:
    """``deploy/scheduler/scheduler-config.yaml`` of the checkout: ``$GPULEDGER_SCHEDULER_CONFIG``, or
    the first found from the working directory upwards, or beside this source tree (an editable
    install). tox and ``dev.py`` run from the checkout's root; an installed copy has no ``deploy/``."""
    configured = os.environ.get("GPULEDGER_SCHEDULER_CONFIG")
    if configured:
        return Path(configured)
    here = Path(__file__).resolve()
    for directory in (Path.cwd(), *Path.cwd().parents, *here.parents):
        if (directory / SCHEDULER_CONFIG).is_file():
            return directory / SCHEDULER_CONFIG
    raise ControlPlaneError(
        f"cannot find {SCHEDULER_CONFIG} from {Path.cwd()} or {here.parent}: run from the gpuledger checkout "
        "or set GPULEDGER_SCHEDULER_CONFIG"
    )


def scheduler_config(
    extender_url: str, tls: Mapping[str, Any] | None = None, source: Path | None = None
) -> dict[str, Any]:
    """gpuledger's scheduler configuration from ``deploy/`` with the extender pointed at
    ``extender_url``, over HTTPS with ``tls`` as its ``tlsConfig`` (its files), else plain HTTP."""
    config = yaml.safe_load((source or find_scheduler_config()).read_text())
    for extender in config.get("extenders", []):
        extender["urlPrefix"] = extender_url
        extender["enableHTTPS"] = tls is not None
        extender.pop("tlsConfig", None)
        if tls is not None:
            extender["tlsConfig"] = dict(tls)
    return dict(config)


def plain_scheduler_config(name: str) -> dict[str, Any]:
    """A kube-scheduler configuration with one profile ``name`` and no extender."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": name}],
    }


def _gates(gates: Mapping[str, bool]) -> str:
    return ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False
