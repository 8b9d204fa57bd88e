"""The inventory's settings, loaded as every service's are: flags over env over defaults, and bad
values refused naming the field; the flags users had keep working (``--nats``, ``--x false``)."""

from __future__ import annotations

import socket

import pytest

from gpuledger_common.settings import SettingsError, describe, load
from gpuledger_inventory.settings import InventorySettings


def settings(argv: list[str], env: dict[str, str] | None = None) -> InventorySettings:
    return load(InventorySettings, argv, env or {})


def test_flags_beat_env_beat_defaults() -> None:
    env = {"GPULEDGER_NODE": "env-node", "GPULEDGER_HEARTBEAT_INTERVAL_S": "2", "GPULEDGER_IGNORE_XIDS": "13, 43"}
    s = settings(["--node", "flag-node", "--nats", "nats://h:1"], env)
    assert (s.node, s.nats_url, s.heartbeat_interval_s) == ("flag-node", "nats://h:1", 2.0)
    assert s.ignore_xids == frozenset({13, 43})
    assert s.poll_interval_s == 10.0
    assert s.kube == "auto"


def test_the_node_defaults_to_node_name_then_the_host_name() -> None:
    assert settings([], {"NODE_NAME": "from-k8s"}).node == "from-k8s"
    assert settings([], {"NODE_NAME": "from-k8s", "GPULEDGER_NODE": "ours"}).node == "ours"
    assert settings([]).node == socket.gethostname()


@pytest.mark.parametrize(
    ("argv", "env", "value"),
    [
        (["--recover-on-nvml-return", "false"], {}, False),
        (["--no-recover-on-nvml-return"], {}, False),
        (["--recover-on-nvml-return"], {"GPULEDGER_RECOVER_ON_NVML_RETURN": "false"}, True),
        ([], {"GPULEDGER_RECOVER_ON_NVML_RETURN": "off"}, False),
        ([], {}, True),
    ],
)
def test_a_switch_takes_a_value_or_none(argv: list[str], env: dict[str, str], value: bool) -> None:
    assert settings(["--node", "n", *argv], env).recover_on_nvml_return is value


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--heartbeat-interval-s", "0"], "heartbeat_interval_s: must be positive"),
        (["--event-wait-ms", "x"], "--event-wait-ms: 'x' is not a valid int"),
        (["--kube", "maybe"], "kube: must be one of auto, in-cluster, kubeconfig or off, got 'maybe'"),
        (["--kube", "on"], "kube: 'on' is not a mode; use in-cluster or kubeconfig"),
        (["--ignore-xids", "13,x"], "--ignore-xids: '13,x' is not a comma-separated list of int"),
        (["--nats", "http://x"], "nats_url: the URL ('http://x') must start with nats://"),
        (["--log-level", "loud"], "log_level: must be debug|info|warning|error"),
        (["--log-format", "xml"], "log_format: must be text|json"),
        (["--mode", "both"], "mode: must be one of classic|dra, got 'both'"),
        (["--mode", "dra", "--kube", "off"], "mode: dra publishes ResourceSlices and needs Kubernetes (kube is off)"),
        (["--mode", "dra", "--slots-per-card", "0"], "slots_per_card: must be 1.."),
        (["--mode", "dra", "--dra-memory-step-mib", "0"], "dra_memory_step_mib: must be 1..65536"),
    ],
)
def test_a_bad_setting_is_named(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(["--node", "n", *argv])
    assert str(caught.value).startswith(message)


def test_nodes_are_classic_unless_told_and_dra_reads_from_the_environment() -> None:
    assert settings(["--node", "n1"]).mode == "classic"
    env = {"GPULEDGER_MODE": "dra", "GPULEDGER_KUBE": "in-cluster", "GPULEDGER_DRA_BINDING_CONDITIONS": "false"}
    found = settings(["--node", "n1"], env)
    assert (found.mode, found.kube, found.dra_binding_conditions, found.slots_per_card) == (
        "dra", "in-cluster", False, 8,
    )  # fmt: skip
    assert settings(["--node", "n1", "--mode", "dra"]).dra_binding_conditions


def test_the_startup_line_hides_a_password_and_lists_the_xids() -> None:
    shown = describe(settings(["--node", "n", "--nats", "nats://u:secret@h:4222", "--ignore-xids", "43,13"]))
    assert shown["nats_url"] == "nats://***@h:4222"
    assert shown["ignore_xids"] == [13, 43]
