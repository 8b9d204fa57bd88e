"""The Helm chart rendered by the real helm (built from its Go module), and the kustomize renders it
is compared with, both brought to a form in which the same objects compare equal."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, KUSTOMIZE, sources
from tests.support.helm import helm_binary
from tests.unit.deploy.kustomize import Obj, build

NAMESPACE = "gpuledger"
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")
# The ConfigMaps kustomize generates (names with a content hash there, plain in the chart).
GENERATED = {o["metadata"]["name"] for objs in sources().values() for o in objs if o["kind"] == "ConfigMap"}


def helm() -> Path:
    """The helm that ``python -m tests.support.helm`` builds; a test without it fails, naming that."""
    binary = helm_binary()
    if not binary.is_file():
        pytest.fail(f"no helm at {binary}: build it with python -m tests.support.helm (tox -e helm does)")
    return binary


def run_helm(*args: str, kubeconfig: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": "/tmp/gpuledger-helm/cache",
        "HELM_CONFIG_HOME": "/tmp/gpuledger-helm/config",
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    done = subprocess.run([str(helm()), *args], capture_output=True, text=True, timeout=120, env=env, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done


def values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / f"values-{len(list(tmp_path.glob('values-*')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def template(tmp_path: Path, values: dict[str, Any] | None = None, *extra: str) -> list[Obj]:
    """``helm template`` of the chart with ``values``: its objects."""
    args = ["template", "gpuledger", str(CHART), "-n", NAMESPACE, "-f", str(values_file(tmp_path, values or {}))]
    out = run_helm(*args, *extra).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def template_fails(tmp_path: Path, values: dict[str, Any], namespace: str = NAMESPACE) -> str:
    args = ["template", "gpuledger", str(CHART), "-n", namespace, "-f", str(values_file(tmp_path, values))]
    done = run_helm(*args, check=False)
    assert done.returncode != 0, f"helm template took {values}"
    return done.stderr


def key(obj: Obj) -> tuple[str, str | None, str]:
    return obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]


def without_helm(objects: list[Obj]) -> list[Obj]:
    """The chart's objects less what Helm adds: its labels, and the pods' checksum annotations."""
    found = copy.deepcopy(objects)
    for obj in found:
        labels = obj["metadata"].get("labels", {})
        for name in HELM_LABELS:
            assert name in labels, f"{key(obj)} lacks the label {name}"
            del labels[name]
        template = obj.get("spec", {}).get("template", {}).get("metadata", {})
        notes = template.get("annotations", {})
        for name in [n for n in notes if n.startswith("checksum/")]:
            del notes[name]
        if "annotations" in template and not notes:
            del template["annotations"]
    return found


def _unhash(node: Any, names: dict[str, str]) -> Any:
    if isinstance(node, str):
        return names.get(node, node)
    if isinstance(node, list):
        return [_unhash(item, names) for item in node]
    if isinstance(node, dict):
        return {k: _unhash(v, names) for k, v in node.items()}
    return node


def kustomize(directory: Path) -> list[Obj]:
    """What kustomize renders in ``directory``, its generated ConfigMaps under their plain names."""
    objects = build(directory)
    names = {}
    for obj in objects:
        name = obj["metadata"]["name"]
        plain = name.rsplit("-", 1)[0]
        if obj["kind"] == "ConfigMap" and plain in GENERATED:
            names[name] = plain
    return [_unhash(o, names) for o in objects]


def assert_same_objects(chart: list[Obj], rendered: list[Obj], what: str) -> None:
    ours = {key(o): o for o in without_helm(chart)}
    theirs = {key(o): o for o in rendered}
    assert len(ours) == len(chart), "the chart renders an object twice"
    assert sorted(ours, key=str) == sorted(theirs, key=str), what
    for k, obj in theirs.items():
        assert ours[k] == obj, f"{what}: {k} renders differently"


PRODUCTION = KUSTOMIZE / "overlays" / "production"
