"""The README's main job with one node real: ``gpuledger dev up --kubernetes real --real-node rtx-0
--once`` runs the demo scenario with rtx-0's pods as real containers (what they got is what they
printed) and the other nodes on kwok, and passes."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(600)
def test_the_demo_passes_with_a_real_node() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuledger_cli", "dev", "up", "--kubernetes", "real", "--real-node", "rtx-0", "--once",
         "--dashboard-port", "0"],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rtx-0 a real node (kubelet and containerd)" in out
    assert "scenario passed" in out and "FAIL" not in out
    assert "ok   app-c deleted: the allocator released its cards" in out, out
    assert "stopped every process; removed sockets and logs" in out
