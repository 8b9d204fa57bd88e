"""Build the control plane's binaries from Go modules, cached outside the checkout, keyed by version.

    python -m gpuledger_dev.controlplane.build          # build what is missing, print the bin dir
    python -m gpuledger_dev.controlplane.build --go     # only find or install Go, print its go

``k8s.io/kubernetes`` cannot be ``go install``ed (its go.mod replaces every staging module with a
path inside its own tree), so it builds through a tools module written here: it requires
``k8s.io/kubernetes`` and replaces each staging module with the published ``v0.<minor>.<patch>``
version. The list of staging modules, and the ``go`` and ``godebug`` lines, are read from the
upstream go.mod in the module cache, never written by hand. etcd builds from a tools module of its
own with no replaces; kwok installs with ``go install``. The Go they build with is PATH's when it is
1.26 or newer, else one installed into the user's cache (``toolchain``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuledger_dev.controlplane.toolchain import Go, GoUnavailable, find_go

KUBERNETES = "v1.36.3"
ETCD = "v3.6.16"
KWOK = "v0.8.0"

KUBE_COMMANDS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "kubelet")
STAGING_LINE = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/k8s\.io/[\w.-]+\s*$")


class BuildError(RuntimeError):
    """A control-plane binary could not be built; the message says which step failed."""


@dataclass(frozen=True, slots=True)
class Binaries:
    """Paths of the built binaries."""

    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    kubectl: Path
    kubelet: Path  # for a real node (``gpuledger_dev.realnode``)
    etcd: Path
    kwok: Path


def cache_root() -> Path:
    """Where built binaries live: ``$GPULEDGER_TOOLS_CACHE`` or ``~/.cache/gpuledger/tools``."""
    configured = os.environ.get("GPULEDGER_TOOLS_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "gpuledger" / "tools"


def binaries(root: Path | None = None) -> Binaries:
    """The paths the binaries have once built (they may not exist yet)."""
    base = root or cache_root()
    kube = base / f"kubernetes-{KUBERNETES}" / "bin"
    return Binaries(
        kube_apiserver=kube / "kube-apiserver",
        kube_scheduler=kube / "kube-scheduler",
        kube_controller_manager=kube / "kube-controller-manager",
        kubectl=kube / "kubectl",
        kubelet=kube / "kubelet",
        etcd=base / f"etcd-{ETCD}" / "bin" / "etcd",
        kwok=base / f"kwok-{KWOK}" / "bin" / "kwok",
    )


def missing(found: Binaries) -> list[Path]:
    """The binaries of ``found`` that are not there yet."""
    paths = [getattr(found, name) for name in found.__slots__]
    return [path for path in paths if not path.is_file()]


def _say(message: str) -> None:
    print(f"[controlplane build] {message}", file=sys.stderr, flush=True)


def go_for_builds(root: Path | None = None) -> Go:
    """The Go the builds run (PATH's if 1.26+, else ours beside ``root``); says which and why."""
    try:
        go = find_go((root or cache_root()).parent)
    except GoUnavailable as err:
        raise BuildError(f"the control plane builds from Go modules: {err}") from err
    _say(f"Go: {go.why}")
    return go


def run_go(go: Go, args: Sequence[str], cwd: Path, what: str, extra: Mapping[str, str] | None = None) -> str:
    env = {**os.environ, **go.env(), "GOWORK": "off", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod", **(extra or {})}
    cmd = [str(go.binary), *args]
    started = time.monotonic()
    _say(f"{what}: {' '.join(cmd)}")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("go: downloading"):
            _say(line.strip())
    if proc.wait() != 0:
        tail = "".join(lines[-40:])
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    _say(f"{what}: done in {time.monotonic() - started:.0f} s")
    return "".join(lines)


def write_module(workdir: Path, module: str, go_mod: str, imports: Sequence[str]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "go.mod").write_text(go_mod)
    blank = "\n".join(f'\t_ "{path}"' for path in imports)
    (workdir / "tools.go").write_text(f"//go:build tools\n\npackage {module}\n\nimport (\n{blank}\n)\n")


def upstream_go_mod(go: Go, workdir: Path) -> str:
    """The text of ``k8s.io/kubernetes``'s own go.mod, from the module cache (downloaded if needed)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = run_go(
        go, ["mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES}"], workdir, "fetch k8s.io/kubernetes"
    )
    start = out.find("{")
    if start < 0:
        raise BuildError(f"'go mod download -json' printed no JSON:\n{out[-2000:]}")
    info = json.loads(out[start:])
    return Path(info["GoMod"]).read_text()


def kube_tools_go_mod(upstream: str) -> str:
    """The tools module's go.mod, derived from the upstream one (staging replaces, ``go``, ``godebug``)."""
    staging = sorted({m.group(1) for line in upstream.splitlines() if (m := STAGING_LINE.match(line))})
    if not staging:
        raise BuildError("the upstream go.mod lists no ./staging/ replaces: the layout changed")
    go_line = next((line for line in upstream.splitlines() if line.startswith("go ")), None)
    if go_line is None:
        raise BuildError("the upstream go.mod has no 'go' line")
    godebug = [line for line in upstream.splitlines() if line.startswith("godebug")]
    staging_version = "v0." + KUBERNETES.removeprefix("v1.")
    replaces = "\n".join(f"\t{name} => {name} {staging_version}" for name in staging)
    return (
        "module gpuledger.io/tools/kubernetes\n\n"
        f"{go_line}\n\n"
        + ("\n".join(godebug) + "\n\n" if godebug else "")
        + f"require k8s.io/kubernetes {KUBERNETES}\n\nreplace (\n{replaces}\n)\n"
    )


def install(built: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    shutil.copy2(built, tmp)
    tmp.chmod(0o755)
    tmp.replace(target)


def build_kubernetes(go: Go, root: Path, found: Binaries) -> None:
    workdir = root / "src" / f"kubernetes-{KUBERNETES}"
    upstream = upstream_go_mod(go, workdir / "probe")
    write_module(workdir, "tools", kube_tools_go_mod(upstream), [f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_COMMANDS])
    run_go(go, ["mod", "tidy"], workdir, "resolve k8s.io/kubernetes modules")
    stamp = " ".join(
        f"-X k8s.io/{pkg}/version.{key}={value}"
        for pkg in ("component-base", "client-go/pkg")
        for key, value in (
            ("gitVersion", KUBERNETES),
            ("gitMajor", "1"),
            ("gitMinor", KUBERNETES.split(".")[1]),
            ("gitTreeState", "clean"),
        )
    )
    for command in KUBE_COMMANDS:
        target: Path = getattr(found, command.replace("-", "_"))
        if target.is_file():
            continue
        out = workdir / "out" / command
        run_go(
            go,
            [
                "build",
                "-trimpath",
                "-ldflags",
                f"-s -w {stamp}",
                "-o",
                str(out),
                f"k8s.io/kubernetes/cmd/{command}",
            ],
            workdir,
            f"build {command} {KUBERNETES}",
        )
        install(out, target)


def build_etcd(go: Go, root: Path, found: Binaries) -> None:
    workdir = root / "src" / f"etcd-{ETCD}"
    go_mod = f"module gpuledger.io/tools/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 {ETCD}\n"
    write_module(workdir, "tools", go_mod, ["go.etcd.io/etcd/server/v3"])
    run_go(go, ["mod", "tidy"], workdir, "resolve etcd modules")
    out = workdir / "out" / "etcd"
    run_go(
        go,
        ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out), "go.etcd.io/etcd/server/v3"],
        workdir,
        f"build etcd {ETCD}",
    )
    install(out, found.etcd)


def build_kwok(go: Go, root: Path, found: Binaries) -> None:
    gobin = root / "src" / f"kwok-{KWOK}"
    gobin.mkdir(parents=True, exist_ok=True)
    args = ["install", "-trimpath", "-ldflags", "-s -w", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK}"]
    run_go(go, args, gobin, f"build kwok {KWOK}", {"GOBIN": str(gobin)})
    install(gobin / "kwok", found.kwok)


def ensure_built(root: Path | None = None) -> Binaries:
    """Build whatever binary is missing from the cache and return the paths of all of them."""
    base = root or cache_root()
    found = binaries(base)
    todo = missing(found)
    if not todo:
        return found
    _say(f"building {len(todo)} missing binaries into {base} (a first build takes several minutes)")
    go = go_for_builds(base)
    started = time.monotonic()
    if not found.etcd.is_file():
        build_etcd(go, base, found)
    if not found.kwok.is_file():
        build_kwok(go, base, found)
    if any(not getattr(found, c.replace("-", "_")).is_file() for c in KUBE_COMMANDS):
        build_kubernetes(go, base, found)
    if missing(found):
        raise BuildError(f"still missing after the build: {', '.join(map(str, missing(found)))}")
    _say(f"all binaries built in {time.monotonic() - started:.0f} s")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="cache directory (default: %(default)s)")
    parser.add_argument("--go", action="store_true", help="only find (or install) the Go the build uses; print it")
    args = parser.parse_args(argv)
    try:
        printed = go_for_builds(args.cache).binary if args.go else ensure_built(args.cache).kubectl.parent
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(printed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
