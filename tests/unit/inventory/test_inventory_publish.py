"""Payloads, labels and settings of the inventory: pure parts."""

from __future__ import annotations

import pytest

from gpuledger_common.fleet import parse_fleet
from gpuledger_core import codec
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ids import NodeName
from gpuledger_core.model import Health
from gpuledger_inventory.health import HealthBook
from gpuledger_inventory.labels import PREFIX, label_patch, label_value, node_labels
from gpuledger_inventory.nvml import NvmlGpus
from gpuledger_inventory.settings import load_settings
from gpuledger_inventory.state import NodeState
from gpuledger_testing.fake_nvml import FakeNvml
from gpuledger_testing.fleet_sim import node_sim

pytestmark = pytest.mark.timeout(5)


def state_for(profile: str) -> NodeState:
    sim = node_sim(parse_fleet(f"nodes:\n  - name: n1\n    profile: {profile}\n"), "n1")
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


def test_settings_flags_beat_env_beat_defaults() -> None:
    env = {
        "GPULEDGER_NODE": "env-node",
        "GPULEDGER_HEARTBEAT_INTERVAL_S": "2",
        "GPULEDGER_IGNORE_XIDS": "13, 43",
    }
    s = load_settings(["--node", "flag-node", "--nats", "nats://h:1"], env)
    assert (s.node, s.nats_url, s.heartbeat_interval_s) == ("flag-node", "nats://h:1", 2.0)
    assert s.ignore_xids == frozenset({13, 43})
    assert s.poll_interval_s == 10.0
    assert not s.use_kube
    assert load_settings(
        [], {"GPULEDGER_NODE": "n", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    ).use_kube


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--heartbeat-interval-s", "0"], "heartbeat_interval_s"),
        (["--event-wait-ms", "x"], "event_wait_ms"),
        (["--kube", "maybe"], "kube"),
        (["--ignore-xids", "13,x"], "ignore_xids"),
        (["--nats", "http://x"], "nats_url"),
    ],
)
def test_bad_settings_name_the_field(argv: list[str], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        load_settings(["--node", "n", *argv], {})
    assert caught.value.field == field


def test_describe_hides_a_password() -> None:
    s = load_settings(["--node", "n", "--nats", "nats://u:secret@h:4222"], {})
    assert s.describe()["nats_url"] == "nats://***@h:4222"
