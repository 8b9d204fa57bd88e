"""The slice of the real openb default trace kept in the repo (tests/data/openb, see its README)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.requires import unavailable

# tox sets GPULEDGER_OPENB_DIR to the slice in the repo; another directory of openb files may be named.
DATA = Path(os.environ.get("GPULEDGER_OPENB_DIR", Path(__file__).resolve().parents[2] / "data" / "openb"))
NODES = "openb_node_list_gpu_node.csv"
PODS = "openb_pod_list_default.csv"


@pytest.fixture(scope="module")
def trace() -> Path:
    if not (DATA / NODES).is_file() or not (DATA / PODS).is_file():
        unavailable(f"the openb trace slice ({DATA / NODES}, {DATA / PODS})", "it is in the repo: tests/data/openb")
    return DATA
