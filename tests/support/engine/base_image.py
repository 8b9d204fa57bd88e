"""A Debian base image with Python 3.11, made from Debian's archive, for machines that reach no image registry.

``debootstrap --variant=minbase`` lays out bookworm with python3 and python3-venv into a folder,
which is packed into a tarball cached in ``~/.cache/gpuledger/images`` and loaded with
``docker import``. deploy/Dockerfile takes it as ``--build-arg PYTHON_IMAGE=...``.
"""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from pathlib import Path

from gpuledger_dev.controlplane.build import cache_root
from tests.support.engine.apt import require_root
from tests.support.engine.errors import EngineError
from tests.support.engine.steps import say, step

SUITE = "bookworm"
INCLUDE = ("python3", "python3-venv", "ca-certificates")
IMAGE = f"gpuledger-debian-python:{SUITE}"


def tarball(root: Path | None = None) -> Path:
    return (root or cache_root()).parent / "images" / f"debian-{SUITE}-python3.tar"


def _image_present(docker: str, image: str) -> bool:
    proc = subprocess.run([docker, "image", "inspect", image], capture_output=True, check=False)
    return proc.returncode == 0


def _debootstrap(target: Path) -> None:
    require_root("debootstrap")
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(target)]
    with step("+ " + " ".join(cmd)):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise EngineError(f"debootstrap failed (exit {proc.returncode}):\n{tail}")


def _slim(rootfs: Path) -> None:
    """What a container never uses: the package caches and lists, documentation."""
    for folder in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
        subprocess.run(["find", str(rootfs / folder), "-mindepth", "1", "-delete"], check=False)


def _pack(rootfs: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for entry in sorted(rootfs.iterdir()):
            tar.add(entry, arcname=entry.name)
    tmp.replace(out)


def ensure_base_image(docker: str, root: Path | None = None) -> str:
    """The image's name, loaded into the engine (made with debootstrap the first time)."""
    if _image_present(docker, IMAGE):
        return IMAGE
    packed = tarball(root)
    if not packed.is_file():
        with tempfile.TemporaryDirectory(prefix="gpuledger-rootfs-", dir=packed.parent.parent) as tmp:
            rootfs = Path(tmp) / "rootfs"
            _debootstrap(rootfs)
            _slim(rootfs)
            with step(f"pack {packed}"):
                _pack(rootfs, packed)
    changes = ["ENV LANG=C.UTF-8", 'CMD ["python3"]']
    cmd = [docker, "import", *(f"--change={c}" for c in changes), str(packed), IMAGE]
    with step(f"docker import {packed.name} as {IMAGE}"):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise EngineError(f"docker import failed (exit {proc.returncode}): {proc.stderr.strip()}")
    say(f"base image {IMAGE}: {proc.stdout.strip()}")
    return IMAGE
