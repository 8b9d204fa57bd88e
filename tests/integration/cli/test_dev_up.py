"""The README's main job: ``gpuledger dev up --once`` runs the scenario end to end and exits 0."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
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
    assert "rtx-app-a" in done.stdout  # the ledger table is printed


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
