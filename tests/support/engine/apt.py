"""Debian packages the compose tests need, installed with apt-get when missing (as root only)."""

from __future__ import annotations

import os
import shutil
import subprocess

from tests.support.engine.errors import EngineError
from tests.support.engine.steps import say

# What each package provides, to tell whether it is installed already.
PACKAGES = {
    "docker.io": "dockerd",
    "debootstrap": "debootstrap",
}


def missing() -> list[str]:
    return [package for package, binary in PACKAGES.items() if _which(binary) is None]


def _which(binary: str) -> str | None:
    # dockerd lives in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin:/usr/bin")


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise EngineError(
            f"{what} needs root (it installs Debian packages and starts dockerd): run as root, or install "
            "docker.io and debootstrap, start dockerd yourself and set DOCKER_HOST"
        )


def ensure_packages() -> None:
    todo = missing()
    if not todo:
        return
    require_root(f"installing {', '.join(todo)}")
    if shutil.which("apt-get") is None:
        raise EngineError(f"no apt-get to install {', '.join(todo)}: install them with this system's packages")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *todo],
    ):
        say("+ " + " ".join(cmd))
        proc = subprocess.run(cmd, env=env, check=False)
        if proc.returncode != 0:
            raise EngineError(f"{' '.join(cmd)} failed with exit {proc.returncode}")
    still = missing()
    if still:
        raise EngineError(f"apt-get installed {', '.join(todo)} but these are still missing: {', '.join(still)}")
