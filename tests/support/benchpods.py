"""What the Kubernetes benchmarks share: one-card pods of either path, and a process's CPU time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PLAIN = "example.com/gpu"  # a plain extended resource, as another device plugin would advertise it
PATHS = {"plain": ("plain-scheduler", PLAIN), "gpuledger": ("gpuledger-scheduler", "gpuledger.io/gpu")}


def one_card_pods(kind: str, count: int, namespace: str, prefix: str, label: str) -> list[dict[str, Any]]:
    """``count`` pods asking one card: ``kind`` ``plain`` (a kube-scheduler without extender and a
    plain extended resource) or ``gpuledger`` (gpuledger's scheduler and resource); named
    ``<prefix>-<i>`` and labelled ``<label>=<kind>``."""
    scheduler, resource = PATHS[kind]
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{prefix}-{i:05d}", "namespace": namespace, "labels": {label: kind}},
            "spec": {
                "schedulerName": scheduler,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "app", "image": "cuda", "resources": {"limits": {resource: "1"}}}],
            },
        }
        for i in range(count)
    ]


def h100_fleet(directory: Path, nodes: int) -> Path:
    """A fleet file of ``nodes`` nodes of 8 H100 (``h100-<i>``), in ``directory``."""
    path = directory / "bench-fleet.yaml"
    path.write_text("nodes:\n" + "".join(f"  - name: h100-{i}\n    profile: h100-sxm-8\n" for i in range(nodes)))
    return path


def stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name (which may hold spaces)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of the process so far."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
