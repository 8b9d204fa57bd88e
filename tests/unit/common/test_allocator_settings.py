from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger_allocator.settings import AllocatorSettings
from gpuledger_common.settings import SettingsError, describe, load


def test_the_defaults_are_valid() -> None:
    settings = load(AllocatorSettings, [], {})
    assert settings == AllocatorSettings()
    assert settings.nats_url.startswith("nats://")
    assert describe(settings)["grpc_port"] == 50051


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"GPULEDGER_NATS_URL": "http://127.0.0.1:4222"}, "nats_url"),
        ({"GPULEDGER_GRPC_PORT": "65536"}, "grpc_port"),
        ({"GPULEDGER_HTTP_PORT": "-1"}, "http_port"),
        ({"GPULEDGER_LEASE_S": "0"}, "lease_s"),
        ({"GPULEDGER_LEASE_S": "120", "GPULEDGER_MAX_LEASE_S": "60"}, "max_lease_s"),
        ({"GPULEDGER_STALE_AFTER_S": "0"}, "stale_after_s"),
        ({"GPULEDGER_SWEEP_INTERVAL_S": "-2"}, "sweep_interval_s"),
        ({"GPULEDGER_CAS_ATTEMPTS": "0"}, "cas_attempts"),
        ({"GPULEDGER_LEDGER_RETRY_S": "-1"}, "ledger_retry_s"),
        ({"GPULEDGER_BUCKET_REPLICAS": "2"}, "bucket_replicas"),
        ({"GPULEDGER_TRENDS_STEP_S": "0"}, "trends_step_s"),
        ({"GPULEDGER_NODE_TRENDS_STEP_S": "10"}, "node_trends_step_s"),  # shorter than trends_step_s
        ({"GPULEDGER_TRENDS_HOURS": "0"}, "trends_hours"),
        ({"GPULEDGER_TRENDS_STEP_S": "0.1", "GPULEDGER_TRENDS_HOURS": "24"}, "trends_hours"),  # 864,000 samples
        ({"GPULEDGER_NODE_TRENDS_HOURS": "400"}, "node_trends_hours"),
        ({"GPULEDGER_LOG_FORMAT": "xml"}, "log_format"),
        ({"GPULEDGER_LOG_LEVEL": "trace"}, "log_level"),
    ],
)
def test_a_bad_setting_is_rejected_naming_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load(AllocatorSettings, [], env)
    assert str(caught.value).startswith(f"{field}: ")


def test_a_non_nats_url_is_rejected_at_construction() -> None:
    with pytest.raises(SettingsError, match=r"^nats_url: the URL \('http://x'\) must start with nats://"):
        AllocatorSettings(nats_url="http://x")


@pytest.mark.parametrize("url", ["nats://a:4222", "tls://a:4222"])
def test_nats_and_tls_urls_are_accepted(url: str) -> None:
    assert load(AllocatorSettings, ["--nats-url", url], {}).nats_url == url


def test_ports_may_be_zero_for_any_free_port() -> None:
    settings = load(AllocatorSettings, ["--grpc-port", "0", "--http-port", "0"], {})
    assert (settings.grpc_port, settings.http_port) == (0, 0)


@pytest.mark.parametrize(
    ("env", "host"),
    [
        ({}, "127.0.0.1"),  # no TLS, no authentication: loopback only
        ({"GPULEDGER_GRPC_HOST": "0.0.0.0"}, "0.0.0.0"),  # asked for explicitly
        ({"GPULEDGER_GRPC_HOST": "10.1.2.3"}, "10.1.2.3"),
    ],
)
def test_grpc_without_tls_listens_on_loopback_unless_a_host_is_given(env: dict[str, str], host: str) -> None:
    assert load(AllocatorSettings, [], env).grpc_listen_host == host


def test_grpc_with_mutual_tls_listens_on_every_address_by_default(tmp_path: Path) -> None:
    env = {f"GPULEDGER_GRPC_{name}_FILE": str(tmp_path / name) for name in ("CERT", "KEY", "CLIENT_CA")}
    for path in env.values():
        Path(path).write_text("")
    assert load(AllocatorSettings, [], env).grpc_listen_host == "0.0.0.0"
    assert load(AllocatorSettings, ["--grpc-host", "127.0.0.1"], env).grpc_listen_host == "127.0.0.1"
