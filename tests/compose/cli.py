"""The gpuledger CLI of this environment, run on the host against the stack's published port."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

GPULEDGER = str(Path(sys.executable).parent / "gpuledger")


def host(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPULEDGER, *args], capture_output=True, text=True, timeout=timeout, check=False)


def holders(inspect_json: str) -> set[tuple[str, str, str, int, int]]:
    """Every holder of every card: (allocation id, owner id, node, card index, MiB)."""
    nodes: list[dict[str, Any]] = json.loads(inspect_json)["nodes"]
    return {
        (h["allocation_id"], h["owner"]["id"], node["name"], card["index"], h["mem_mib"])
        for node in nodes
        for card in node["cards"]
        for h in card["holders"]
    }
