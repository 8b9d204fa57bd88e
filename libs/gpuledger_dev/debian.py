"""Debian packages a dev-mode tool needs, installed with ``apt-get`` when missing (as root only).

Each package is named with what shows it is installed (a command on PATH or in an sbin directory,
or an absolute path), so a machine that has it already, from Debian or elsewhere, installs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path


class PackageError(RuntimeError):
    """A package is missing and could not be installed; the message says what to do."""


def _say(message: str) -> None:
    print(f"[debian] {message}", file=sys.stderr, flush=True)


def present(proof: str) -> bool:
    if proof.startswith("/"):
        return Path(proof).exists()
    # dockerd lives in /usr/sbin, which a non-login PATH may lack.
    return (shutil.which(proof) or shutil.which(proof, path="/usr/sbin:/sbin:/usr/bin")) is not None


def missing(packages: Mapping[str, str]) -> list[str]:
    """The packages of ``packages`` (name: what shows it installed) that are not installed."""
    return [name for name, proof in packages.items() if not present(proof)]


def ensure_packages(packages: Mapping[str, str], why: str, say: Callable[[str], None] = _say) -> None:
    """Install the missing ones of ``packages`` with apt-get (``why`` goes into every error)."""
    todo = missing(packages)
    if not todo:
        return
    if os.geteuid() != 0:
        raise PackageError(f"{why} needs the Debian packages {', '.join(todo)}: install them, or run as root")
    if shutil.which("apt-get") is None:
        raise PackageError(
            f"{why} needs {', '.join(todo)}, and there is no apt-get: install them with this system's packages"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *todo],
    ):
        say("+ " + " ".join(cmd))
        proc = subprocess.run(cmd, env=env, check=False)
        if proc.returncode != 0:
            raise PackageError(f"{' '.join(cmd)} failed with exit {proc.returncode}")
    still = missing(packages)
    if still:
        raise PackageError(f"apt-get installed {', '.join(todo)} but these are still missing: {', '.join(still)}")
