"""A Docker engine to talk to: the one already answering, or a dockerd started here (as root).

``engine()`` is a context manager: a dockerd it started is stopped when it exits, so a test run
leaves no daemon behind; one that was already running is left alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuledger_dev import children
from gpuledger_dev.controlplane.build import cache_root
from tests.support.engine.apt import require_root
from tests.support.engine.errors import EngineError
from tests.support.engine.steps import say

PIDFILE = Path("/var/run/docker.pid")
START_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Engine:
    docker: str  # the docker CLI
    server_version: str
    storage_driver: str


def docker_cli() -> str:
    found = shutil.which("docker")
    if found is None:
        raise EngineError("no docker CLI on PATH (Debian's docker.io package installs one)")
    return found


def _info(docker: str) -> tuple[str, str] | None:
    try:
        proc = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}} {{.Driver}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    version, _, driver = proc.stdout.strip().partition(" ")
    return version, driver


def _log_tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _clear_stale_pidfile() -> None:
    """A dockerd killed without cleaning up leaves its pid file, and a new one refuses to start."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(PIDFILE.read_text().strip())
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            PIDFILE.unlink()


def _start() -> tuple[subprocess.Popen[bytes], Path]:
    require_root("starting dockerd")
    dockerd = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/usr/bin")
    if dockerd is None:
        raise EngineError("no dockerd: install Debian's docker.io (python -m tests.support.engine prepare does)")
    _clear_stale_pidfile()
    log = cache_root().parent / "dockerd.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"starting {dockerd} (log: {log})")
    with log.open("ab") as out:
        # SIGTERM when this process ends, however it ends: dockerd then stops its containers and containerd.
        proc = children.popen([dockerd], signal.SIGTERM, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    say(f"dockerd stopped (exit {proc.returncode})")


@contextlib.contextmanager
def engine() -> Iterator[Engine]:
    """The engine that answers now, or a dockerd started for the duration of the block."""
    docker = docker_cli()
    found = _info(docker)
    if found is not None:
        yield Engine(docker, *found)
        return
    if os.environ.get("DOCKER_HOST"):
        raise EngineError(f"DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer 'docker info'")
    proc, log = _start()
    try:
        yield _wait_ready(docker, proc, log)
    finally:
        _stop(proc)


def _wait_ready(docker: str, proc: subprocess.Popen[bytes], log: Path) -> Engine:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineError(f"dockerd exited with {proc.returncode}:\n{_log_tail(log)}")
        found = _info(docker)
        if found is not None:
            say(f"dockerd {found[0]} is up (storage driver {found[1]})")
            return Engine(docker, *found)
        time.sleep(0.5)
    _stop(proc)
    raise EngineError(f"dockerd did not answer within {START_TIMEOUT_S:.0f} s:\n{_log_tail(log)}")
