"""helm built from its Go module, cached outside the checkout beside the control plane's binaries.

    python -m tests.support.helm        # build it if it is missing, print its path

``helm.sh/helm/v3`` has no replace directives in its go.mod, so helm installs with ``go install``,
as kwok and promtool do (``gpuledger_dev.controlplane.build``), with the Go those builds use. The
version and the Kubernetes version its ``helm lint`` and ``.Capabilities`` assume are stamped as
helm's own Makefile stamps them (the latter from the ``k8s.io/client-go`` its go.mod requires:
v0.36 is Kubernetes 1.36, the control plane's minor). The binary lands in
``$GPULEDGER_TOOLS_CACHE/helm-<version>/bin/helm`` (default ``~/.cache/gpuledger/tools``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpuledger_dev.controlplane.build import BuildError, run_go
from gpuledger_dev.controlplane.toolchain import Go
from tests.support.gotools import cli, go_install, tool_binary

HELM = "v3.21.4"
MODULE = "helm.sh/helm/v3"
CLIENT_GO = re.compile(r"^\s*k8s\.io/client-go\s+v0\.(\d+)\.\d+", re.MULTILINE)


def helm_binary(root: Path | None = None) -> Path:
    """Where helm is once built (it may not exist yet)."""
    return tool_binary(f"helm-{HELM}", "helm", root)


def kube_minor(go_mod: str) -> str:
    """The Kubernetes minor of the ``k8s.io/client-go`` a go.mod requires (v0.36.2 is 1.36)."""
    found = CLIENT_GO.search(go_mod)
    if found is None:
        raise BuildError(f"{MODULE}@{HELM}'s go.mod requires no k8s.io/client-go")
    return found.group(1)


def _install_args(go: Go, gobin: Path) -> list[str]:
    """``go install``'s arguments: helm's version and the Kubernetes minor of its go.mod stamped."""
    out = run_go(go, ["mod", "download", "-json", f"{MODULE}@{HELM}"], gobin, f"fetch {MODULE}")
    minor = kube_minor(Path(json.loads(out[out.find("{") :])["GoMod"]).read_text())
    stamps = [
        f"{MODULE}/internal/version.version={HELM}",
        f"{MODULE}/internal/version.gitTreeState=clean",
        f"{MODULE}/internal/version.metadata=",
        *(f"{MODULE}/pkg/{pkg}.k8sVersionMajor=1" for pkg in ("lint/rules", "chartutil")),
        *(f"{MODULE}/pkg/{pkg}.k8sVersionMinor={minor}" for pkg in ("lint/rules", "chartutil")),
    ]
    ldflags = " ".join(["-s -w", *(f"-X {stamp}" for stamp in stamps)])
    return ["-trimpath", "-ldflags", ldflags, f"{MODULE}/cmd/helm@{HELM}"]


def build(root: Path | None = None) -> Path:
    """Build helm if it is not in the cache; return the binary."""
    return go_install(f"helm-{HELM}", "helm", root, _install_args, f"build helm {HELM} (a few minutes the first time)")


if __name__ == "__main__":
    raise SystemExit(cli(build))
