"""The images of deploy/Dockerfile, built with no network inside the build.

The wheels come from the host (``pip wheel`` with constraints.txt into ``deploy/wheelhouse/``),
the base from debootstrap (base_image.py). The dev image is built by ``docker compose build``
with deploy/compose/offline.yaml, as a user without a registry would; the production target by
``docker build``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.engine.base_image import IMAGE as BASE_IMAGE
from tests.support.engine.errors import EngineError
from tests.support.engine.steps import step

DEV_IMAGE = "gpuledger:dev"
PRODUCTION_IMAGE = "gpuledger:production"


@dataclass(frozen=True, slots=True)
class Checkout:
    """The repository the images are built from (tox runs in it)."""

    root: Path

    @classmethod
    def here(cls) -> Checkout:
        root = Path.cwd()
        if not (root / "deploy" / "Dockerfile").is_file():
            raise EngineError(f"{root} is not a gpuledger checkout (no deploy/Dockerfile): run from its root")
        return cls(root)

    @property
    def dockerfile(self) -> Path:
        return self.root / "deploy" / "Dockerfile"

    @property
    def wheelhouse(self) -> Path:
        return self.root / "deploy" / "wheelhouse"

    @property
    def compose_files(self) -> tuple[Path, Path]:
        folder = self.root / "deploy" / "compose"
        return folder / "compose.yaml", folder / "offline.yaml"


def _run(cmd: list[str], what: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    with step(what):
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
        raise EngineError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


def make_wheelhouse(checkout: Checkout) -> Path:
    """Every wheel the dev target installs, and setuptools and wheel to build gpuledger's own."""
    checkout.wheelhouse.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--constraint", "constraints.txt"]
    cmd += ["--wheel-dir", str(checkout.wheelhouse), ".", "./libs/gpuledger_dev", "setuptools>=77", "wheel"]
    _run(cmd, "wheels of the pinned dependencies", checkout.root)
    for own in (*checkout.wheelhouse.glob("gpuledger-*.whl"), *checkout.wheelhouse.glob("gpuledger_dev-*.whl")):
        own.unlink()  # the image builds gpuledger and its dev mode from the sources it is given
    return checkout.wheelhouse


def build_cli(docker: str) -> tuple[str, dict[str, str]]:
    """A docker CLI that builds with BuildKit: one with the buildx plugin, or a client from before
    buildx was split out (Debian's docker.io 20.10 has BuildKit built in)."""
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    if subprocess.run([docker, "buildx", "version"], capture_output=True, check=False).returncode == 0:
        return docker, env
    for candidate in ("/usr/bin/docker", docker):
        if not Path(candidate).is_file():
            continue
        version = subprocess.run(
            [candidate, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if version.split(".")[0].isdigit() and int(version.split(".")[0]) < 23:
            return candidate, env
    raise EngineError(
        f"{docker} has no buildx plugin and there is no docker client with BuildKit built in: install "
        "Debian's docker.io (its client is 20.10) or the buildx plugin"
    )


def compose(docker: str, checkout: Checkout, project: str, *args: str) -> list[str]:
    """A ``docker compose`` command line for the stack with the offline override."""
    files = [f"--file={path}" for path in checkout.compose_files]
    return [docker, "compose", *files, f"--project-name={project}", *args]


def build_dev(docker: str, checkout: Checkout, project: str) -> str:
    env = {**os.environ, "GPULEDGER_PYTHON_IMAGE": BASE_IMAGE}
    _run(compose(docker, checkout, project, "build"), f"docker compose build ({DEV_IMAGE})", checkout.root, env)
    return DEV_IMAGE


def build_production(docker: str, checkout: Checkout) -> str:
    cli, env = build_cli(docker)
    cmd = [cli, "build", "--file", str(checkout.dockerfile), "--target", "production"]
    cmd += ["--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "--build-arg", "WHEELS=wheelhouse"]
    cmd += ["--tag", PRODUCTION_IMAGE, "."]
    _run(cmd, f"docker build --target production ({PRODUCTION_IMAGE})", checkout.root, env)
    return PRODUCTION_IMAGE


def image_size_mb(docker: str, image: str) -> float:
    out = subprocess.run(
        [docker, "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip()) / 1e6


def prune(docker: str, checkout: Checkout) -> None:
    """What earlier builds left: gpuledger images that lost their tag (one per compose service and
    rebuild), and build cache beyond a bound, so that repeated runs do not fill the disk."""
    label = "label=org.opencontainers.image.title=gpuledger"
    _run([docker, "image", "prune", "--force", "--filter", label], "remove untagged gpuledger images", checkout.root)
    cli, env = build_cli(docker)
    _run([cli, "builder", "prune", "--force", "--keep-storage=3GB"], "bound the build cache", checkout.root, env)
