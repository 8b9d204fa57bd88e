"""Reading the Alibaba GPU trace's CSV files (``openb_node_list_*.csv``, ``openb_pod_list_*.csv``).

Pod files have 11 columns or, for the multigpu variants, only the first 5; both are accepted by
``read_pods``. ``read_timed_pods`` also reads each pod's QoS class and its times (seconds), which
only the 11-column files have.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuledger_core.errors import InvalidArgument

WHOLE = 1000


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per card
    gpu_spec: str = ""  # allowed models, "A|B"; empty: any

    @property
    def gpu_total(self) -> int:
        """GPU asked in total, per-mille of a card."""
        return self.num_gpu * self.gpu_milli

    @property
    def models(self) -> frozenset[str]:
        return frozenset(m for m in self.gpu_spec.split("|") if m)


@dataclass(frozen=True, slots=True)
class TimedPod:
    """A trace pod with its QoS class and its life in the trace: created, scheduled (None when it
    never ran) and deleted, in seconds."""

    pod: TracePod
    qos: str
    created: int
    deleted: int
    scheduled: int | None

    @property
    def duration(self) -> int:
        """How long it ran in the trace; a pod that never ran counts its whole life."""
        return self.deleted - (self.created if self.scheduled is None else self.scheduled)


def read_nodes(path: Path) -> list[TraceNode]:
    return [_node(row, path, line) for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib"))]


def read_pods(path: Path) -> list[TracePod]:
    return [_pod(row, path, line) for line, row in _rows(path, ("name", "cpu_milli", "num_gpu"))]


def read_timed_pods(path: Path) -> list[TimedPod]:
    required = ("name", "cpu_milli", "num_gpu", "qos", "creation_time", "deletion_time", "scheduled_time")
    return [_timed(row, path, line) for line, row in _rows(path, required)]


def _rows(path: Path, required: tuple[str, ...]) -> Iterable[tuple[int, dict[str, str]]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or ())]
        if missing:
            raise InvalidArgument(str(path), f"missing column(s) {', '.join(missing)}")
        yield from enumerate(reader, start=2)


def _int(row: dict[str, str], column: str, path: Path, line: int) -> int:
    raw = (row.get(column) or "0").strip()
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{path}:{line}", f"{column} must be an integer, got {raw!r}") from None
    if value < 0:
        raise InvalidArgument(f"{path}:{line}", f"{column} must not be negative, got {value}")
    return value


def _node(row: dict[str, str], path: Path, line: int) -> TraceNode:
    return TraceNode(
        row["sn"],
        _int(row, "cpu_milli", path, line),
        _int(row, "memory_mib", path, line),
        _int(row, "gpu", path, line),
        (row.get("model") or "").strip(),
    )


def _pod(row: dict[str, str], path: Path, line: int) -> TracePod:
    pod = TracePod(
        row["name"],
        _int(row, "cpu_milli", path, line),
        _int(row, "memory_mib", path, line),
        _int(row, "num_gpu", path, line),
        _int(row, "gpu_milli", path, line),
        (row.get("gpu_spec") or "").strip(),
    )
    if pod.num_gpu and not 0 < pod.gpu_milli <= WHOLE:
        raise InvalidArgument(f"{path}:{line}", f"gpu_milli must be 1..1000, got {pod.gpu_milli}")
    if pod.num_gpu > 1 and pod.gpu_milli != WHOLE:
        raise InvalidArgument(f"{path}:{line}", "a pod of several GPUs must take them whole")
    return pod


def _timed(row: dict[str, str], path: Path, line: int) -> TimedPod:
    created, deleted = _int(row, "creation_time", path, line), _int(row, "deletion_time", path, line)
    scheduled = _int(row, "scheduled_time", path, line) if (row.get("scheduled_time") or "").strip() else None
    start = created if scheduled is None else scheduled
    if not created <= start <= deleted:
        raise InvalidArgument(f"{path}:{line}", "times must run creation_time <= scheduled_time <= deletion_time")
    return TimedPod(_pod(row, path, line), (row.get("qos") or "").strip(), created, deleted, scheduled)
