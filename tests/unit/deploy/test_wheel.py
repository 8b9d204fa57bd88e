"""The production wheel (``pip wheel .``) holds what production runs and nothing else: no dev mode
(libs/gpuledger_dev is a distribution of its own), no test harness, no sample fleets; and the dev
mode's own wheel holds the dev mode with its data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .services import ROOT

pytestmark = pytest.mark.timeout(300)

SERVICES = ("gpuledger_allocator", "gpuledger_inventory", "gpuledger_placement", "gpuledger_plugin", "gpuledger_cli")
LIBS = ("gpuledger_core", "gpuledger_common", "gpuledger_sim", "gpuledger_proto")


# What a checkout holds that its sources are not: a build/ folder left by an earlier build would
# go into the wheel as it was then (setuptools reuses it), whatever the sources say now.
NOT_SOURCES = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".venv", ".tox", "*.whl")


def sources(project: Path, into: Path, parts: tuple[str, ...]) -> Path:
    """A copy of ``project``'s ``parts`` (files and folders) as a clean checkout has them."""
    into.mkdir()
    for part in parts:
        if (project / part).is_dir():
            shutil.copytree(project / part, into / part, ignore=NOT_SOURCES)
        else:
            shutil.copy2(project / part, into / part)
    return into


def wheel(project: Path, out: Path) -> list[str]:
    """The file names in the wheel pip builds of ``project`` (in its own build environment)."""
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--wheel-dir", str(out), str(project)],
        capture_output=True,
        text=True,
        check=False,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("*.whl")
    with zipfile.ZipFile(built) as archive:
        return archive.namelist()


def tops(names: list[str]) -> set[str]:
    return {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}


def test_the_production_wheel_holds_the_services_and_libraries_only(tmp_path: Path) -> None:
    project = sources(ROOT, tmp_path / "src", ("pyproject.toml", "README.md", "libs", "proto", "services"))
    names = wheel(project, tmp_path / "out")
    assert tops(names) == {*SERVICES, *LIBS}
    assert not [n for n in names if "/fleets/" in n or n.endswith(".yaml") or "/tests/" in n]
    assert not [n for n in names if "gpuledger_testing" in n or "gpuledger_dev" in n]


def test_the_dev_wheel_holds_the_dev_mode_and_its_data(tmp_path: Path) -> None:
    project = shutil.copytree(ROOT / "libs" / "gpuledger_dev", tmp_path / "src", ignore=NOT_SOURCES)
    names = wheel(project, tmp_path / "out")
    assert tops(names) == {"gpuledger_dev"}
    assert "gpuledger_dev/fleets/dev.yaml" in names
    assert "gpuledger_dev/controlplane/stages.yaml" in names
    assert "gpuledger_dev/py.typed" in names
    assert "gpuledger_dev/fake_nvml/mig.py" in names  # a subpackage, named in its pyproject
    assert not [n for n in names if n.endswith("pyproject.toml")]
