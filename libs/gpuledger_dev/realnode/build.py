"""Build a real node's binaries from Go modules, cached beside the control plane's, keyed by version.

    python -m gpuledger_dev.realnode.build     # build what is missing (images too), print the bin dir

A real node is kubelet (from ``k8s.io/kubernetes``, built with the control plane's other commands),
containerd with its runc shim and ``ctr`` (from ``github.com/containerd/containerd/v2``), runc
(``github.com/opencontainers/runc``, the one C-linked build: its ``nsenter`` is C, so it needs gcc)
and the CNI plugins a pod sandbox needs (``loopback``, ``bridge``, ``host-local``). Versions are
chosen for this machine's cgroup v1 hierarchies: containerd 2.2 and runc 1.4 still support v1
(both deprecated it, neither removed it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuledger_dev import debian
from gpuledger_dev.controlplane import build as cp
from gpuledger_dev.controlplane.toolchain import Go
from gpuledger_dev.realnode.images import ImageError, ensure_images

CONTAINERD = "v2.2.9"
RUNC = "v1.4.4"  # built with libseccomp (see build_runc); the directory name says so
RUNC_FLAVOUR = "seccomp"
CNI_PLUGINS = "v1.9.1"

RUNC_PACKAGES = {"gcc": "gcc", "pkg-config": "pkg-config", "libseccomp-dev": "/usr/include/seccomp.h"}
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")
CNI_COMMANDS = {"loopback": "main/loopback", "bridge": "main/bridge", "host-local": "ipam/host-local"}


@dataclass(frozen=True, slots=True)
class NodeBinaries:
    """Paths of a real node's binaries (they may not exist yet)."""

    kubelet: Path
    containerd: Path
    containerd_shim_runc_v2: Path
    ctr: Path
    runc: Path
    cni_dir: Path  # loopback, bridge, host-local

    @property
    def runtime_dir(self) -> Path:
        """The directory containerd looks in for its shim (and runc), put first on its PATH."""
        return self.containerd.parent

    def all(self) -> list[Path]:
        return [
            self.kubelet,
            self.containerd,
            self.containerd_shim_runc_v2,
            self.ctr,
            self.runc,
            *(self.cni_dir / name for name in CNI_COMMANDS),
        ]


def node_binaries(root: Path | None = None) -> NodeBinaries:
    base = root or cp.cache_root()
    runtime = base / f"containerd-{CONTAINERD}" / "bin"
    return NodeBinaries(
        kubelet=cp.binaries(base).kubelet,
        containerd=runtime / "containerd",
        containerd_shim_runc_v2=runtime / "containerd-shim-runc-v2",
        ctr=runtime / "ctr",
        runc=base / f"runc-{RUNC}-{RUNC_FLAVOUR}" / "bin" / "runc",
        cni_dir=base / f"cni-plugins-{CNI_PLUGINS}" / "bin",
    )


def _say(message: str) -> None:
    print(f"[node build] {message}", file=sys.stderr, flush=True)


def build_containerd(go: Go, root: Path, found: NodeBinaries) -> None:
    workdir = root / "src" / f"containerd-{CONTAINERD}"
    module = "github.com/containerd/containerd/v2"
    go_mod = f"module gpuledger.io/tools/containerd\n\ngo 1.24\n\nrequire {module} {CONTAINERD}\n"
    cp.write_module(workdir, "tools", go_mod, [f"{module}/cmd/{command}" for command in CONTAINERD_COMMANDS])
    cp.run_go(go, ["mod", "tidy"], workdir, "resolve containerd modules")
    stamp = f"-X {module}/version.Version={CONTAINERD}"
    for command in CONTAINERD_COMMANDS:
        target: Path = getattr(found, command.replace("-", "_"))
        if target.is_file():
            continue
        out = workdir / "out" / command
        args = ["build", "-trimpath", "-tags", "no_btrfs", "-ldflags", f"-s -w {stamp}", "-o", str(out)]
        cp.run_go(go, [*args, f"{module}/cmd/{command}"], workdir, f"build {command} {CONTAINERD}")
        cp.install(out, target)


def build_runc(go: Go, root: Path, found: NodeBinaries) -> None:
    """runc with cgo (its namespace setup runs in C before Go starts) and libseccomp: kubelet asks
    the runtime's default seccomp profile for every pod sandbox, and a runc without seccomp fails it."""
    try:
        debian.ensure_packages(RUNC_PACKAGES, f"building runc {RUNC}", _say)
    except debian.PackageError as err:
        raise cp.BuildError(str(err)) from err
    workdir = root / "src" / f"runc-{RUNC}"
    go_mod = f"module gpuledger.io/tools/runc\n\ngo 1.24\n\nrequire github.com/opencontainers/runc {RUNC}\n"
    cp.write_module(workdir, "tools", go_mod, ["github.com/opencontainers/runc"])
    cp.run_go(go, ["mod", "tidy"], workdir, "resolve runc modules")
    out = workdir / "out" / "runc"
    stamp = f"-X main.version={RUNC.removeprefix('v')}"
    args = ["build", "-trimpath", "-buildmode=pie", "-tags", "seccomp", "-ldflags", f"-s -w {stamp}", "-o", str(out)]
    cp.run_go(go, [*args, "github.com/opencontainers/runc"], workdir, f"build runc {RUNC}", {"CGO_ENABLED": "1"})
    cp.install(out, found.runc)


def build_cni(go: Go, root: Path, found: NodeBinaries) -> None:
    workdir = root / "src" / f"cni-plugins-{CNI_PLUGINS}"
    module = "github.com/containernetworking/plugins"
    go_mod = f"module gpuledger.io/tools/cni\n\ngo 1.24\n\nrequire {module} {CNI_PLUGINS}\n"
    cp.write_module(workdir, "tools", go_mod, [f"{module}/plugins/{path}" for path in CNI_COMMANDS.values()])
    cp.run_go(go, ["mod", "tidy"], workdir, "resolve CNI plugin modules")
    for name, path in CNI_COMMANDS.items():
        target = found.cni_dir / name
        if target.is_file():
            continue
        out = workdir / "out" / name
        args = ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out), f"{module}/plugins/{path}"]
        cp.run_go(go, args, workdir, f"build CNI {name} {CNI_PLUGINS}")
        cp.install(out, target)


def ensure_node_built(root: Path | None = None) -> NodeBinaries:
    """Build whatever a real node lacks (the control plane's binaries first, kubelet among them)."""
    base = root or cp.cache_root()
    cp.ensure_built(base)
    found = node_binaries(base)
    todo = [path for path in found.all() if not path.is_file()]
    if not todo:
        return found
    _say(f"building {len(todo)} missing binaries into {base} (a first build takes several minutes)")
    go = cp.go_for_builds(base)
    started = time.monotonic()
    if any(not getattr(found, c.replace("-", "_")).is_file() for c in CONTAINERD_COMMANDS):
        build_containerd(go, base, found)
    if not found.runc.is_file():
        build_runc(go, base, found)
    if any(not (found.cni_dir / name).is_file() for name in CNI_COMMANDS):
        build_cni(go, base, found)
    left = [str(path) for path in found.all() if not path.is_file()]
    if left:
        raise cp.BuildError(f"still missing after the build: {', '.join(left)}")
    _say(f"node binaries built in {time.monotonic() - started:.0f} s")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="cache directory (default: the control plane's)")
    args = parser.parse_args(argv)
    try:
        found = ensure_node_built(args.cache)
        ensure_images(args.cache)
    except (cp.BuildError, ImageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(found.runtime_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
