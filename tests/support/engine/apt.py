"""Debian packages the compose tests need, installed with apt-get when missing (as root only)."""

from __future__ import annotations

import os

from gpuledger_dev import debian
from tests.support.engine.errors import EngineError
from tests.support.engine.steps import say

# What each package provides, to tell whether it is installed already.
PACKAGES = {
    "docker.io": "dockerd",
    "debootstrap": "debootstrap",
}


def missing() -> list[str]:
    return debian.missing(PACKAGES)


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise EngineError(
            f"{what} needs root (it installs Debian packages and starts dockerd): run as root, or install "
            "docker.io and debootstrap, start dockerd yourself and set DOCKER_HOST"
        )


def ensure_packages() -> None:
    todo = missing()
    if todo:
        require_root(f"installing {', '.join(todo)}")
    try:
        debian.ensure_packages(PACKAGES, "the compose tests", say)
    except debian.PackageError as err:
        raise EngineError(str(err)) from err
