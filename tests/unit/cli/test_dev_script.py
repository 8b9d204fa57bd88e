"""dev.py, the README's two commands: it refuses a Python outside pyproject's requires-python, before
installing anything, naming the one it found and the ones it wants."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def dev_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_script", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_supported_range_is_pyprojects() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    (low_major, low_minor), (high_major, high_minor) = dev_script().SUPPORTED
    assert requires == f">={low_major}.{low_minor},<{high_major}.{high_minor}"


@pytest.mark.parametrize("version", [(3, 11), (3, 12), (3, 13)])
def test_a_supported_python_is_accepted(version: tuple[int, int]) -> None:
    dev_script().check_python(version)


@pytest.mark.parametrize("version", [(3, 9), (3, 10), (3, 14), (4, 0)])
def test_another_python_is_refused_naming_it(version: tuple[int, int]) -> None:
    with pytest.raises(SystemExit) as refused:
        dev_script().check_python(version)
    message = str(refused.value.code)
    assert f"is Python {version[0]}.{version[1]}" in message
    assert "needs Python >=3.11,<3.14" in message and "python3.11, python3.12, python3.13" in message


def test_the_check_comes_before_any_install(tmp_path: Path) -> None:
    """A refused Python leaves no .venv behind (run on a copy of dev.py in an empty directory)."""
    (tmp_path / "dev.py").write_text((ROOT / "dev.py").read_text())
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.version_info = (3, 10, 0, 'final', 0)\n")
    done = subprocess.run(
        [sys.executable, "dev.py", "test"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "is Python 3.10" in done.stderr
    assert not (tmp_path / ".venv").exists()
