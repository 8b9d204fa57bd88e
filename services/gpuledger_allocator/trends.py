"""The dashboard's trends: the cluster's and each node's totals sampled into bounded rings in
memory (``GET /api/history?node=&hours=``), so that the page can plot the last hours.

Every ``step_s`` the cluster's totals are taken; every ``node_step_s`` every node's, as one frame of
columns (a 32-bit integer per node and series: at 5,000 nodes and seven series a frame is 140 kB,
and the default 72 frames 10 MB). Each ring keeps ``hours`` of frames and drops the oldest. Nothing is
written anywhere: a restarted replica starts with no trends, and each replica keeps its own
(they sample the same ledger, at their own times). Prometheus is the long-term store
(docs/dashboard.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger_allocator.overview import NodeRow, Overview, totals

log = logging.getLogger(__name__)

# The series of a frame, in its columns' order: what a row holds (the used ones -1: not reported).
SERIES = ("memory_mib", "granted_mib", "used_mib", "core_milli", "granted_core_milli", "holders", "frag_milli",
          "free_milli", "used_core_milli")  # fmt: skip
REPORTED = frozenset({"used_mib", "used_core_milli"})  # the series a node may not report
NOT_REPORTED = -1


def columns_of(row: NodeRow) -> tuple[int, ...]:
    used = NOT_REPORTED if row.used_mib is None else row.used_mib
    sm = NOT_REPORTED if row.used_core_milli is None else row.used_core_milli
    return (row.memory_mib, row.granted_mib, used, row.core_milli, row.granted_core_milli, row.holders,
            round(row.frag.milli), row.frag.free_milli, sm)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Frame:
    """The series of several rows at one time: ``index`` names each row's position in the columns."""

    at: float
    index: dict[str, int]
    columns: tuple[array[int], ...]

    @staticmethod
    def of(at: float, rows: Sequence[NodeRow], index: dict[str, int] | None = None) -> Frame:
        """A frame of ``rows``; ``index`` is reused when it names the same rows in the same order."""
        if index is None or len(index) != len(rows) or any(index.get(r.name) != i for i, r in enumerate(rows)):
            index = {row.name: i for i, row in enumerate(rows)}
        values = [columns_of(row) for row in rows]
        return Frame(at, index, tuple(array("i", (v[k] for v in values)) for k in range(len(SERIES))))

    def get(self, name: str) -> tuple[int, ...] | None:
        at = self.index.get(name)
        return None if at is None else tuple(column[at] for column in self.columns)


@dataclass(slots=True)
class Ring:
    """Frames every ``step_s`` for ``hours``; the oldest dropped."""

    step_s: float
    hours: float
    frames: deque[Frame] = field(init=False)

    def __post_init__(self) -> None:
        self.frames = deque(maxlen=max(1, math.ceil(self.hours * 3600 / self.step_s)))

    def due(self, now: float) -> bool:
        return not self.frames or now - self.frames[-1].at >= self.step_s * 0.999

    def add(self, frame: Frame) -> None:
        self.frames.append(frame)

    def series(self, name: str, since: float) -> dict[str, list[Any]]:
        """``name``'s values since ``since``, by series, with their times (``at``); a frame without
        the name is left out, and a value not reported is None."""
        out: dict[str, list[Any]] = {"at": [], **{key: [] for key in SERIES}}
        for frame in self.frames:
            if frame.at < since:
                continue
            values = frame.get(name)
            if values is None:
                continue
            out["at"].append(frame.at)
            for key, value in zip(SERIES, values, strict=True):
                out[key].append(None if key in REPORTED and value == NOT_REPORTED else value)
        return out


CLUSTER = ""  # the cluster's row in the cluster ring


@dataclass(slots=True)
class Trends:
    """The cluster's ring and the nodes' ring of one replica."""

    cluster: Ring
    nodes: Ring

    def sample(self, now: float, rows: Sequence[NodeRow]) -> None:
        """Take the frames that are due at ``now`` from every node's row."""
        if self.cluster.due(now):
            self.cluster.add(Frame.of(now, [totals(rows)]))
        if self.nodes.due(now):
            last = self.nodes.frames[-1].index if self.nodes.frames else None
            self.nodes.add(Frame.of(now, rows, last))

    def answer(self, node: str, hours: float, now: float) -> dict[str, Any]:
        ring = self.nodes if node else self.cluster
        hours = min(max(hours, 0.0), ring.hours)
        return {"node": node, "step_s": ring.step_s, "hours": hours, **ring.series(node or CLUSTER, now - hours * 3600)}


async def sample_every(trends: Trends, overview: Overview, clock: Callable[[], float] = time.time) -> None:
    """Sample forever, every ``cluster.step_s`` (the node ring takes what is due of them)."""
    while True:
        try:
            await overview.warm()
            trends.sample(clock(), overview.rows())
        except Exception:  # a bug in one sample must not end the allocator: log it, try next time
            log.exception("the dashboard's trends could not be sampled")
        await asyncio.sleep(trends.cluster.step_s)
