"""promtool built from its Go module, cached outside the checkout beside the control plane's binaries.

    python -m tests.support.promtool        # build it if it is missing, print its path

``github.com/prometheus/prometheus`` has no replace directives in its go.mod, so promtool installs
with ``go install``, as kwok does (``gpuledger_dev.controlplane.build``), with the Go those builds
use. It is built with Prometheus's own build tag ``remove_all_sd``, which leaves out the optional
service discoveries (cloud SDKs promtool never needs to check or test rules): measured here on 2
cores with empty module and build caches, 110 s and a 54 MB binary. The binary lands in
``$GPULEDGER_TOOLS_CACHE/prometheus-<version>/bin/promtool`` (default ``~/.cache/gpuledger/tools``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpuledger_dev.controlplane.build import BuildError, cache_root, go_for_builds, install, run_go

PROMETHEUS = "v0.316.0"  # the Go module's version of Prometheus 3.16.0
RELEASE = "3.16.0"
TAGS = "remove_all_sd"


def promtool_binary(root: Path | None = None) -> Path:
    """Where promtool is once built (it may not exist yet)."""
    return (root or cache_root()) / f"prometheus-{PROMETHEUS}" / "bin" / "promtool"


def build(root: Path | None = None) -> Path:
    """Build promtool if it is not in the cache; return the binary."""
    target = promtool_binary(root)
    if target.is_file():
        return target
    base = root or cache_root()
    go = go_for_builds(base)
    gobin = base / "src" / f"prometheus-{PROMETHEUS}"
    gobin.mkdir(parents=True, exist_ok=True)
    stamp = f"-X github.com/prometheus/common/version.Version={RELEASE}"
    package = f"github.com/prometheus/prometheus/cmd/promtool@{PROMETHEUS}"
    args = ["install", "-trimpath", "-tags", TAGS, "-ldflags", f"-s -w {stamp}", package]
    run_go(go, args, gobin, f"build promtool {RELEASE} (about 2 minutes the first time)", {"GOBIN": str(gobin)})
    install(gobin / "promtool", target)
    return target


def main() -> int:
    try:
        print(build())
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
