"""deploy/kubernetes: the manifest tests' Python rendering (tests/unit/deploy/kustomize.py) is what
the real ``kubectl kustomize`` renders, object for object.

The kubectl is the control plane's own (v1.36.3), which the e2e env builds before the suite runs,
never whatever stands on PATH: the comparison is the same on every machine, and cannot be skipped
for want of a tool (a kubectl that cannot be built fails the test).
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from gpuledger_dev.controlplane.build import ensure_built
from tests.unit.deploy.manifests import KUSTOMIZE, RENDERS, key, rendered


@pytest.mark.parametrize("path", RENDERS)
def test_the_python_rendering_is_what_kubectl_kustomize_renders(path: str) -> None:
    kubectl = ensure_built().kubectl
    out = subprocess.run(
        [kubectl, "kustomize", str(KUSTOMIZE / path)], capture_output=True, text=True, check=True, timeout=60
    )
    theirs = {key(o): o for o in yaml.safe_load_all(out.stdout) if o}
    ours = {key(o): o for o in rendered(path)}
    assert sorted(ours, key=str) == sorted(theirs, key=str)
    for k, obj in ours.items():
        assert obj == theirs[k], f"{path}: {k} renders differently"
