"""Go tools the tests need, built with ``go install`` into the cache beside the control plane's
binaries (``gpuledger_dev.controlplane.build``): where each lands, one build, and the command line
that builds one and prints its path."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from gpuledger_dev.controlplane.build import BuildError, cache_root, go_for_builds, install, run_go
from gpuledger_dev.controlplane.toolchain import Go


def tool_binary(project: str, binary: str, root: Path | None = None) -> Path:
    """Where ``binary`` of ``project`` (its name and version, ``helm-v3.21.4``) is once built:
    ``<cache>/<project>/bin/<binary>``."""
    return (root or cache_root()) / project / "bin" / binary


def go_install(
    project: str,
    binary: str,
    root: Path | None,
    args: Callable[[Go, Path], list[str]],
    label: str,
) -> Path:
    """Build ``binary`` unless it is in the cache; return it. ``args(go, gobin)`` gives the
    ``go install`` arguments (it may run go itself first, as helm's reads its module's go.mod)."""
    target = tool_binary(project, binary, root)
    if target.is_file():
        return target
    base = root or cache_root()
    go = go_for_builds(base)
    gobin = base / "src" / project
    gobin.mkdir(parents=True, exist_ok=True)
    run_go(go, ["install", *args(go, gobin)], gobin, label, {"GOBIN": str(gobin)})
    install(gobin / binary, target)
    return target


def cli(build: Callable[[], Path]) -> int:
    """Build, print the binary's path; a failed build is one line on stderr and exit status 1."""
    try:
        print(build())
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0
