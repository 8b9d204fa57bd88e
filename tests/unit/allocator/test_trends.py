"""The dashboard's trends: bounded rings of frames, each series by row, sampled when due."""

from __future__ import annotations

import pytest

from gpuledger_allocator.overview import NodeRow
from gpuledger_allocator.trends import SERIES, Frame, Ring, Trends
from gpuledger_core.fragmentation import Fragmentation


def row(name: str, granted: int, used: int | None = None, holders: int = 1) -> NodeRow:
    return NodeRow(name, cards=1, memory_mib=1000, granted_mib=granted, used_mib=used, core_milli=1000,
                   granted_core_milli=granted // 2, holders=holders, frag=Fragmentation(12.6, 400))  # fmt: skip


def test_a_ring_keeps_its_hours_and_drops_the_oldest() -> None:
    ring = Ring(step_s=600, hours=1)  # six frames
    for minute in range(0, 80, 10):
        ring.add(Frame.of(minute * 60.0, [row("a", minute)]))
    assert ring.frames.maxlen == 6
    assert ring.series("a", 0)["at"] == [m * 60.0 for m in (20, 30, 40, 50, 60, 70)]


def test_a_series_holds_each_value_of_its_row_since_the_time_asked() -> None:
    ring = Ring(step_s=1, hours=1)
    ring.add(Frame.of(10.0, [row("a", 100, used=None), row("b", 7)]))
    ring.add(Frame.of(11.0, [row("b", 8)]))  # a gone for a while
    ring.add(Frame.of(12.0, [row("a", 300, used=250, holders=2), row("b", 9)]))
    a = ring.series("a", 0)
    assert a["at"] == [10.0, 12.0]
    assert a["granted_mib"] == [100, 300] and a["used_mib"] == [None, 250]  # not reported: None
    assert a["used_core_milli"] == [None, None]
    assert (a["holders"], a["frag_milli"], a["free_milli"]) == ([1, 2], [13, 13], [400, 400])
    assert ring.series("b", 11.0)["granted_mib"] == [8, 9]
    assert ring.series("nobody", 0) == {"at": [], **{key: [] for key in SERIES}}


def test_frames_share_their_index_while_the_rows_are_the_same() -> None:
    first = Frame.of(1.0, [row("a", 1), row("b", 2)])
    same = Frame.of(2.0, [row("a", 3), row("b", 4)], first.index)
    other = Frame.of(3.0, [row("a", 3), row("c", 4)], first.index)
    assert same.index is first.index and same.get("b") is not None
    assert other.index is not first.index and other.get("b") is None and other.get("c") is not None


def test_the_cluster_is_sampled_every_step_and_the_nodes_when_their_step_is_due() -> None:
    trends = Trends(Ring(step_s=30, hours=1), Ring(step_s=300, hours=1))
    for at in range(0, 601, 30):
        trends.sample(float(at), [row("a", at), row("b", 1)])
    assert len(trends.cluster.frames) == 21
    assert [f.at for f in trends.nodes.frames] == [0.0, 300.0, 600.0]
    cluster = trends.answer("", hours=1, now=600.0)
    assert cluster["granted_mib"][-1] == 601 and cluster["memory_mib"][-1] == 2000 and cluster["step_s"] == 30
    node = trends.answer("a", hours=0.1, now=600.0)  # 6 minutes: the last two node frames
    assert (node["at"], node["granted_mib"], node["step_s"]) == ([300.0, 600.0], [300, 600], 300)


@pytest.mark.parametrize(("asked", "kept"), [(48.0, 2.0), (-1.0, 0.0), (0.5, 0.5)])
def test_an_answer_covers_no_more_than_the_ring_keeps(asked: float, kept: float) -> None:
    trends = Trends(Ring(step_s=60, hours=2), Ring(step_s=60, hours=2))
    assert trends.answer("", asked, now=0.0)["hours"] == kept
