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

from pathlib import Path

from tests.support.gotools import cli, go_install, tool_binary

PROMETHEUS = "v0.316.0"  # the Go module's version of Prometheus 3.16.0
RELEASE = "3.16.0"
TAGS = "remove_all_sd"


def promtool_binary(root: Path | None = None) -> Path:
    """Where promtool is once built (it may not exist yet)."""
    return tool_binary(f"prometheus-{PROMETHEUS}", "promtool", root)


def build(root: Path | None = None) -> Path:
    """Build promtool if it is not in the cache; return the binary."""
    stamp = f"-X github.com/prometheus/common/version.Version={RELEASE}"
    package = f"github.com/prometheus/prometheus/cmd/promtool@{PROMETHEUS}"
    return go_install(
        f"prometheus-{PROMETHEUS}",
        "promtool",
        root,
        lambda _go, _gobin: ["-trimpath", "-tags", TAGS, "-ldflags", f"-s -w {stamp}", package],
        f"build promtool {RELEASE} (about 2 minutes the first time)",
    )


if __name__ == "__main__":
    raise SystemExit(cli(build))
