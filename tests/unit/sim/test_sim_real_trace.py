"""A slice of the real default trace, replayed and checked independently."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from gpuledger_sim import check, cli

pytestmark = pytest.mark.timeout(30)

# The trace lives in the shared folder beside the checkout (CI lays it there too).
ROOT = Path(__file__).resolve().parents[3]
DATA = Path(os.environ.get("GPULEDGER_OPENB_DIR", ROOT.parent / "shared" / "data" / "openb"))


@pytest.mark.skipif(not DATA.is_dir(), reason="the openb trace is not on this machine")
def test_slice_of_the_default_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_all = (DATA / "openb_node_list_gpu_node.csv").read_text().splitlines()
    pods_all = (DATA / "openb_pod_list_default.csv").read_text().splitlines()
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    # every 8th node and every 8th pod keep the trace's mix at an eighth of the size
    nodes.write_text("\n".join([nodes_all[0], *nodes_all[1::8]]) + "\n")
    pods.write_text("\n".join([pods_all[0], *pods_all[1::8]]) + "\n")
    out = tmp_path / "placements.jsonl"
    argv = ["--nodes", str(nodes), "--pods", str(pods), "--json", "--placements", str(out)]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert check.main([str(out), "--nodes", str(nodes)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["unallocated_gpu_pct_at_100"] == summary["unallocated_gpu_pct_at_100"]
    assert 0 < summary["unallocated_gpu_pct_at_100"] < 20
    assert summary["arrived_gpu_pct_final"] > 125
