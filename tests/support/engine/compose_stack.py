"""The compose stack of deploy/compose, up for a test module and down after it.

Runs ``docker compose`` with deploy/compose/offline.yaml under its own project name, with the
host ports (loopback only) picked free, and gives the tests what they ask of it: the state of
each service by its health check, commands in a container, the host ports, the logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuledger_dev.natsserver import free_port
from tests.support.engine.base_image import IMAGE as BASE_IMAGE
from tests.support.engine.errors import EngineError
from tests.support.engine.images import Checkout, compose


@dataclass(slots=True)
class ComposeStack:
    docker: str
    checkout: Checkout
    project: str
    dashboard_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    tls_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gl-compose-tls-")))

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "GPULEDGER_PYTHON_IMAGE": BASE_IMAGE,
            "GPULEDGER_DASHBOARD_PORT": str(self.dashboard_port),
            "GPULEDGER_GRPC_HOST_PORT": str(self.grpc_port),
        }

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def grpc_flags(self) -> list[str]:
        """The CLI's flags for the published gRPC port, as the admin the credentials service made."""
        return _grpc_flags(self.grpc_address, str(self.tls_dir))

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}/"

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = compose(self.docker, self.checkout, self.project, *args)
        proc = subprocess.run(
            cmd, cwd=self.checkout.root, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise EngineError(f"{' '.join(cmd[1:])} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    def docker_cmd(self, *args: str, timeout: float = 60) -> str:
        proc = subprocess.run([self.docker, *args], capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise EngineError(f"docker {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def up(self, timeout_s: float = 240) -> float:
        """``up --wait``: every service started and healthy by its health check; the seconds it took."""
        started = time.monotonic()
        self.compose("up", "--detach", "--wait", f"--wait-timeout={timeout_s:.0f}", timeout=timeout_s + 60)
        took = time.monotonic() - started
        # The admin's certificate for the host's CLI, from the admin's volume the credentials service wrote.
        self.docker_cmd("cp", f"{self.container('credentials')}:/credentials/admin/.", str(self.tls_dir))
        return took

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout=20", timeout=180)

    def services(self) -> dict[str, dict[str, Any]]:
        """``docker compose ps`` of every container, stopped ones included, by service."""
        out = self.compose("ps", "--all", "--format=json").stdout
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return {row["Service"]: row for row in rows}

    def container(self, service: str) -> str:
        found = self.compose("ps", "--all", "--quiet", service).stdout.split()
        if len(found) != 1:
            raise EngineError(f"service {service} has {len(found)} containers")
        return found[0]

    def inspect(self, service: str, template: str) -> str:
        return self.docker_cmd("inspect", f"--format={template}", self.container(service)).strip()

    def exec(self, service: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.compose("exec", "-T", service, *cmd, timeout=timeout, check=False)

    def run(self, service: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``cmd`` in a new container of ``service`` (one of a profile, such as the CLI), removed after."""
        return self.compose("run", "--rm", "--no-deps", "-T", service, *cmd, timeout=timeout, check=False)

    def logs(self, *services: str) -> list[str]:
        return self.compose("logs", "--no-color", *services).stdout.splitlines()

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, volumes and networks of this project that still exist."""
        label = f"label=com.docker.compose.project={self.project}"
        return {
            kind: self.docker_cmd(*cmd, "--filter", label).split()
            for kind, cmd in (
                ("containers", ("ps", "--all", "--quiet")),
                ("volumes", ("volume", "ls", "--quiet")),
                ("networks", ("network", "ls", "--quiet")),
            )
        }


def _grpc_flags(server: str, tls: str) -> list[str]:
    return [
        "--server",
        server,
        "--ca-file",
        f"{tls}/ca.crt",
        "--cert-file",
        f"{tls}/admin.crt",
        "--key-file",
        f"{tls}/admin.key",
    ]


# The CLI's flags inside the stack's cli container: the allocator by its service name, the admin's
# certificate from the admin's credentials volume, mounted there alone.
IN_CONTAINER_GRPC = _grpc_flags("allocator:50051", "/credentials")
