"""Payloads and labels of the inventory: pure parts."""

from __future__ import annotations

import pytest

from gpuledger_core import codec
from gpuledger_core.ids import NodeName
from gpuledger_core.model import Health
from gpuledger_dev.fake_nvml import FakeNvml
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.fleet_script import node_script
from gpuledger_inventory.health import HealthBook
from gpuledger_inventory.labels import PREFIX, label_patch, label_value, node_labels
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.state import NodeState

pytestmark = pytest.mark.timeout(5)


def state_for(profile: str) -> NodeState:
    sim = node_script(parse_fleet(f"nodes:\n  - name: n1\n    profile: {profile}\n"), "n1")
    fake = FakeNvml(sim)
    gpus = NvmlGpus(fake, fake.numa_node, "fake")
    gpus.open()
    state = NodeState(NodeName("n1"), "fake", HealthBook())
    scan = gpus.scan()
    state.apply_scan(scan, 1.0)
    state.apply_usage(gpus.usage(scan), 1.0)
    state.nvml_up(1.0)
    return state


def test_the_message_round_trips_through_the_codec() -> None:
    state = state_for("a100-mig-1")
    state.book.set(state.uuids()[0], False, "bob", "checking", 2.0)
    message = state.message(3.0)
    node = codec.node_from(codec.Reader(message["node"]))
    assert node == state.node()
    assert node.cards[0].health is Health.UNHEALTHY
    assert node.cards[0].health_reason == "checking"
    extra = message["extra"]
    assert extra["nvml"]["ok"] is True
    assert extra["cards"][0]["mig"]["mode"] == "enabled"
    assert len(extra["cards"][0]["mig"]["instances"]) == 4
    assert extra["cards"][0]["health"]["by"] == "operator:bob"
    assert extra["health_log"][0]["by"] == "operator:bob"


def test_labels_of_an_h100_node() -> None:
    labels = node_labels(state_for("h100-sxm-8").scan)  # type: ignore[arg-type]
    assert labels == {
        f"{PREFIX}count": "8",
        f"{PREFIX}product": "NVIDIA-H100-80GB-HBM3",
        f"{PREFIX}memory": "81559",
        f"{PREFIX}family": "hopper",
        f"{PREFIX}compute.major": "9",
        f"{PREFIX}compute.minor": "0",
        f"{PREFIX}driver": "560.35.03",
        f"{PREFIX}cuda": "12.6",
        f"{PREFIX}nvlink": "true",
        f"{PREFIX}nvswitch": "true",
        f"{PREFIX}mig.capable": "true",
        f"{PREFIX}mig.enabled": "false",
    }


def test_labels_of_a_p4_node() -> None:
    labels = node_labels(state_for("tesla-p4-2").scan)  # type: ignore[arg-type]
    assert labels[f"{PREFIX}family"] == "pascal"
    assert labels[f"{PREFIX}nvlink"] == labels[f"{PREFIX}mig.capable"] == "false"


def test_the_patch_touches_only_owned_labels() -> None:
    current = {
        "kubernetes.io/hostname": "n1",
        f"{PREFIX}count": "8",
        f"{PREFIX}old": "x",
        "gpuledger.io/other": "y",
    }
    desired = {f"{PREFIX}count": "8", f"{PREFIX}product": "P4"}
    assert label_patch(current, desired) == {f"{PREFIX}product": "P4", f"{PREFIX}old": None}
    assert label_patch(desired, desired) == {}


@pytest.mark.parametrize(
    ("text", "want"), [("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"), ("  x/y  ", "x-y")]
)
def test_label_values(text: str, want: str) -> None:
    assert label_value(text) == want
