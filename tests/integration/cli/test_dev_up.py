"""The README's main job: ``gpuledger dev up --once`` runs the scenario end to end and exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from typing import IO

import pytest


@pytest.mark.timeout(200)
def test_dev_up_once_runs_the_scenario() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuledger_cli", "dev", "up", "--once", "--dashboard-port", "0"],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scenario passed" in done.stdout
    assert "FAIL" not in done.stdout
    assert "demo/app-a[app]" in done.stdout  # the ledger table is printed
    assert "unhealthy (XID 79: GPU has fallen off the bus)" in done.stdout
    assert "stopped every process; removed sockets and logs" in done.stdout


def test_bad_fleet_file_stops_before_anything_starts(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    bad = tmp_path / "fleet.yaml"
    bad.write_text("nodes:\n  - name: n1\n    profile: nope\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpuledger_cli", "dev", "up", "--once", "--fleet", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert f"{bad}:3: nodes[0].profile: unknown profile 'nope'" in done.stderr
    assert "nats-server" not in done.stdout


def _started(line: str) -> dict[str, int]:
    """``started allocator (pid 1), placement (pid 2), ...`` -> {name: pid}."""
    found = re.findall(r"([\w.-]+) \(pid (\d+)\)", line)
    return {name: int(pid) for name, pid in found}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _until(stream: IO[str], marker: str) -> list[str]:
    lines = []
    for line in stream:
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError(f"{marker!r} never printed:\n{''.join(lines)}")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["a service dies", "ctrl-c"])
def test_dev_up_stops_everything_and_leaves_nothing_behind(how: str) -> None:
    up = subprocess.Popen(
        [sys.executable, "-m", "gpuledger_cli", "dev", "up", "--dashboard-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert up.stdout is not None
        lines = _until(up.stdout, "Ctrl-C stops everything")
        pids = _started(next(line for line in lines if "started allocator" in line))
        run_dir = next(line.split(" in ")[-1].strip() for line in lines if "logs and sockets in" in line)
        assert set(pids) >= {"allocator", "placement", "plugin-rtx-0", "inventory-rtx-0"}
        if how == "ctrl-c":
            up.send_signal(signal.SIGINT)
        else:
            os.kill(pids["plugin-rtx-0"], signal.SIGKILL)
        out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    if how == "ctrl-c":
        assert up.returncode == 0, err
    else:
        assert up.returncode == 1
        assert "plugin-rtx-0 exited with -9" in err
    assert "stopped every process; removed sockets and logs" in out
    assert not [name for name, pid in pids.items() if _alive(pid)]
    assert not os.path.exists(run_dir)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--real-node", "rtx-0"], "--real-node needs --kubernetes real"),
        (
            ["--kubernetes", "real", "--real-node", "nope"],
            "--real-node nope: not in the fleet (rtx-0, p4-0, h100-0, a100-mig-0)",
        ),
    ],
)
def test_a_real_node_is_asked_for_on_the_real_control_plane_and_by_a_name_of_the_fleet(
    args: list[str], said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuledger_cli", "dev", "up", "--once", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and said in done.stderr, done.stdout + done.stderr
    assert "starting" not in done.stdout  # refused before anything started
