"""Docker Compose v2 built from its Go module and installed as the docker CLI plugin.

Compose builds through a tools module written here (it requires ``github.com/docker/compose/v2``;
the ``go`` line is read from the upstream go.mod in the module cache), into
``$GPULEDGER_TOOLS_CACHE/compose-<version>/bin`` (default ``~/.cache/gpuledger/tools``, beside
the control plane's binaries), and is linked as ``~/.docker/cli-plugins/docker-compose``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from gpuledger_dev.controlplane.build import cache_root
from gpuledger_dev.controlplane.toolchain import Go, GoUnavailable, find_go
from tests.support.engine.errors import EngineError
from tests.support.engine.steps import say, step

COMPOSE = "v2.40.3"
MODULE = "github.com/docker/compose/v2"


def compose_binary(root: Path | None = None) -> Path:
    return (root or cache_root()) / f"compose-{COMPOSE}" / "bin" / "docker-compose"


def plugin_path() -> Path:
    config = os.environ.get("DOCKER_CONFIG")
    base = Path(config) if config else Path.home() / ".docker"
    return base / "cli-plugins" / "docker-compose"


def _go(root: Path | None) -> Go:
    try:
        go = find_go((root or cache_root()).parent)
    except GoUnavailable as err:
        raise EngineError(f"Docker Compose builds from its Go module: {err}") from err
    say(f"Go: {go.why}")
    return go


def _run(go: Go, args: list[str], cwd: Path, what: str) -> str:
    env = {**os.environ, **go.env(), "GOWORK": "off", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    cmd = [str(go.binary), *args]
    with step(what):
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise EngineError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout


def _upstream_go_line(go: Go, workdir: Path) -> str:
    out = _run(go, ["mod", "download", "-json", f"{MODULE}@{COMPOSE}"], workdir, f"fetch {MODULE} {COMPOSE}")
    go_mod = Path(json.loads(out)["GoMod"]).read_text()
    if "=>" in go_mod:
        raise EngineError(f"{MODULE} {COMPOSE} has replace directives now: the tools module must carry them")
    line = next((line for line in go_mod.splitlines() if line.startswith("go ")), None)
    if line is None:
        raise EngineError(f"the go.mod of {MODULE} {COMPOSE} has no 'go' line")
    return line


def build(root: Path | None = None) -> Path:
    """Build Compose if it is not in the cache; return the binary."""
    target = compose_binary(root)
    if target.is_file():
        return target
    go = _go(root)
    workdir = (root or cache_root()) / "src" / f"compose-{COMPOSE}"
    (workdir / "probe").mkdir(parents=True, exist_ok=True)
    go_line = _upstream_go_line(go, workdir / "probe")
    (workdir / "go.mod").write_text(f"module gpuledger.io/tools/compose\n\n{go_line}\n\nrequire {MODULE} {COMPOSE}\n")
    (workdir / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{MODULE}/cmd"\n')
    _run(go, ["mod", "tidy"], workdir, "resolve the Compose modules")
    out = workdir / "out" / "docker-compose"
    ldflags = f"-s -w -X {MODULE}/internal.Version={COMPOSE}"
    _run(
        go,
        ["build", "-trimpath", "-ldflags", ldflags, "-o", str(out), f"{MODULE}/cmd"],
        workdir,
        f"build docker compose {COMPOSE} (several minutes the first time)",
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    shutil.copy2(out, tmp)
    tmp.chmod(0o755)
    tmp.replace(target)
    return target


def install_plugin(binary: Path) -> Path:
    """Link the built binary as the docker CLI's compose plugin (``docker compose``)."""
    plugin = plugin_path()
    if plugin.is_symlink() and plugin.resolve() == binary.resolve():
        return plugin
    if plugin.exists() and not plugin.is_symlink():
        say(f"{plugin} exists and is not ours: using it as it is")
        return plugin
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.unlink(missing_ok=True)
    plugin.symlink_to(binary)
    say(f"docker compose: {plugin} -> {binary}")
    return plugin
