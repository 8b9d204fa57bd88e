"""The two images a real node runs, built here with no registry, as OCI archives for ``ctr import``.

- the pod sandbox (``pause``): our own ``pause.c``, linked statically with this machine's gcc;
- the workload (``busybox``): Debian's ``busybox-static`` (downloaded with ``apt-get download``,
  never installed), with the applets the tests use as links.

Both are one uncompressed layer, with every timestamp at zero, cached under the tools cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpuledger_dev import debian
from gpuledger_dev.controlplane import build as cp

IMAGES_VERSION = "2"  # bump when what goes into an image changes
PAUSE_IMAGE = f"localhost/gpuledger/pause:{IMAGES_VERSION}"
WORKLOAD_IMAGE = f"localhost/gpuledger/busybox:{IMAGES_VERSION}"
APPLETS = ("sh", "env", "ls", "cat", "sleep", "echo", "grep", "sed", "head", "id", "stat", "test", "true", "wc", "ps")
DIRECTORIES = ("bin", "dev", "etc", "proc", "sys", "tmp", "var")

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class ImageError(RuntimeError):
    """An image could not be built; the message says which step failed and why."""


@dataclass(frozen=True, slots=True)
class Images:
    pause: Path
    workload: Path


def images(root: Path | None = None) -> Images:
    base = (root or cp.cache_root()) / f"images-{IMAGES_VERSION}"
    return Images(pause=base / "pause.oci.tar", workload=base / "busybox.oci.tar")


def ensure_images(root: Path | None = None) -> Images:
    found = images(root)
    if not found.pause.is_file():
        _write(found.pause, oci_archive(PAUSE_IMAGE, _layer({"pause": _pause_binary()}, {}), ["/pause"]))
    if not found.workload.is_file():
        busybox = _busybox_binary()
        links = {f"bin/{applet}": "busybox" for applet in APPLETS}
        layer = _layer({"bin/busybox": busybox}, links)
        _write(found.workload, oci_archive(WORKLOAD_IMAGE, layer, ["/bin/sh"]))
    return found


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _checked(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise ImageError(f"{what}: {' '.join(cmd)} failed ({done.returncode}): {(done.stderr or done.stdout)[-1500:]}")


def _pause_binary() -> bytes:
    try:
        debian.ensure_packages({"gcc": "gcc", "libc6-dev": "/usr/include/stdio.h"}, "building the pause image")
    except debian.PackageError as err:
        raise ImageError(str(err)) from err
    source = resources.files("gpuledger_dev.realnode").joinpath("pause.c").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pause.c").write_text(source)
        _checked(["gcc", "-static", "-Os", "-s", "-o", "pause", "pause.c"], "build the pause binary", Path(tmp))
        return (Path(tmp) / "pause").read_bytes()


def _busybox_binary() -> bytes:
    if not (debian.present("apt-get") and debian.present("dpkg-deb")):
        raise ImageError("the workload image takes Debian's busybox-static: apt-get and dpkg-deb are needed")
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        download = ["apt-get", "download", "-q", "busybox-static"]
        if subprocess.run(download, cwd=where, capture_output=True, check=False, timeout=600).returncode != 0:
            # A fresh machine's package lists may be empty; read them once and try again.
            _checked(["apt-get", "update", "-q"], "read Debian's package lists")
            _checked(download, "download busybox-static", where)
        debs = sorted(where.glob("busybox-static_*.deb"))
        if not debs:
            raise ImageError(f"apt-get download busybox-static left no .deb in {where}")
        _checked(["dpkg-deb", "-x", str(debs[0]), "root"], "unpack busybox-static", where)
        binary = where / "root" / "bin" / "busybox"
        if not binary.is_file():
            raise ImageError(f"{debs[0].name} holds no bin/busybox")
        return binary.read_bytes()


def _layer(files: dict[str, bytes], links: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in DIRECTORIES:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for name, target in sorted(links.items()):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
    return out.getvalue()


def oci_archive(name: str, layer: bytes, entrypoint: list[str]) -> bytes:
    """An OCI image layout, as one tar, holding one image ``name`` of one layer."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_ref = blob(layer, LAYER)
    config = {
        "architecture": _architecture(),
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_ref["digest"]]},
    }
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": blob(_json(config), CONFIG), "layers": [layer_ref]}
    manifest_ref = blob(_json(manifest), MANIFEST)
    manifest_ref["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
    index = {"schemaVersion": 2, "manifests": [manifest_ref]}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": _json(index)}
        entries.update({f"blobs/sha256/{digest.removeprefix('sha256:')}": data for digest, data in blobs.items()})
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _architecture() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
