"""The trace as MIG (gpuledger_sim.mig_replay): each pod's profile, and the three ways on a small
cluster whose outcome is known by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuledger_sim.cli import main
from gpuledger_sim.mig_replay import profile_of, replay_mig
from gpuledger_sim.trace import TraceNode, TracePod


def pod(name: str, milli: int, gpus: int = 1) -> TracePod:
    return TracePod(name, 1000, 1024, gpus, milli, "")


@pytest.mark.parametrize(
    ("milli", "profile"),
    [
        (100, "1g.5gb"),
        (121, "1g.5gb"),
        (122, "1g.10gb"),
        (200, "2g.10gb"),
        (300, "3g.20gb"),
        (450, "4g.20gb"),
        (500, "7g.40gb"),
        (1000, "7g.40gb"),
    ],
)
def test_each_share_maps_to_the_smallest_profile_that_holds_it(milli: int, profile: str) -> None:
    found = profile_of(pod("p", milli))
    assert found is not None and found.name == profile


def test_the_three_ways_on_one_card() -> None:
    """One card, four pods: a 3g, a 4g, a 1g and a 2g share. all-balanced has no 4g: the 4g-sized
    pod fits nowhere, the others each take their instance, in any order. On demand every instance
    served is one made (a reconfiguration), and what is served fits the card's 8 memory slices."""
    nodes = [TraceNode("n", 64000, 262144, 1, "A100")]
    pods = [pod("a", 300), pod("b", 450), pod("c", 100), pod("d", 200)]
    static = replay_mig(nodes, pods, "static", tune=0)
    assert (static.served, static.instances_made, static.static_instances) == (3, 0, 4)
    for way in ("first-fit", "gpuledger"):
        found = replay_mig(nodes, pods, way, tune=0)
        sizes = {"3g.20gb": 4, "4g.20gb": 4, "1g.5gb": 1, "2g.10gb": 2}
        used = sum(sizes[p] * n for p, n in found.profiles.items())
        assert found.served == found.instances_made == sum(found.profiles.values()) >= 2, way
        assert used <= 8 and found.unused_slices_pct_at_100 == 100 * (8 - used) / 8


def test_the_cli_replays_mig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,32000,65536,2,A100\n")
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,1000,1024,1,100,\n")
    argv = [
        "--nodes",
        str(tmp_path / "nodes.csv"),
        "--pods",
        str(tmp_path / "pods.csv"),
        "--mig",
        "gpuledger",
        "--tune",
        "0",
    ]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["served"] == 1
