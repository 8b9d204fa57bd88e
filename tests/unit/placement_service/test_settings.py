"""The placement service's settings: defaults, environment, validation naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger_common.settings import SettingsError, load
from gpuledger_core.packing import Guard
from gpuledger_placement.app import build
from gpuledger_placement.kube import NoPodApi
from gpuledger_placement.settings import PlacementSettings, parse_guard


def test_defaults_and_environment() -> None:
    settings = load(PlacementSettings, [], {"GPULEDGER_POLICY": "fgd", "GPULEDGER_SLOTS_PER_CARD": "4"})
    assert settings.policy == "fgd" and settings.slots_per_card == 4
    assert settings.url_prefix == "/gpuledger" and settings.kube == "auto"
    assert load(PlacementSettings, ["--policy", "spread"], {"GPULEDGER_POLICY": "fgd"}).policy == "spread"
    assert settings.assume_ttl_s == 30.0
    assert load(PlacementSettings, [], {"GPULEDGER_ASSUME_TTL_S": "5"}).assume_ttl_s == 5.0


@pytest.mark.parametrize(
    ("env", "host"),
    [
        ({}, "127.0.0.1"),  # the verbs in plain HTTP take no authentication: loopback only
        ({"GPULEDGER_HTTP_HOST": "0.0.0.0"}, "0.0.0.0"),  # asked for explicitly
    ],
)
def test_the_extender_in_plain_http_listens_on_loopback_unless_a_host_is_given(env: dict[str, str], host: str) -> None:
    assert load(PlacementSettings, [], env).listen_host == host


def test_with_the_extenders_tls_the_ports_listen_on_every_address_by_default(tmp_path: Path) -> None:
    env = {f"GPULEDGER_EXTENDER_{name}_FILE": str(tmp_path / name) for name in ("CERT", "KEY", "CLIENT_CA")}
    for path in env.values():
        Path(path).write_text("")
    assert load(PlacementSettings, [], env).listen_host == "0.0.0.0"
    assert load(PlacementSettings, ["--http-host", "127.0.0.1"], env).listen_host == "127.0.0.1"


def test_the_assumption_ttl_reaches_the_service() -> None:
    parts = build(PlacementSettings(kube="off", assume_ttl_s=7.5), None, NoPodApi(), None)
    assert parts.service.assumed.ttl_s == 7.5


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--policy", "fastest"], "policy"),
        (["--url-prefix", "gpuledger/"], "url_prefix"),
        (["--kube", "maybe"], "kube"),
        (["--slots-per-card", "0"], "slots_per_card"),
        (["--assume-ttl-s", "0"], "assume_ttl_s"),
        (["--assume-ttl-s", "601"], "assume_ttl_s"),
        (["--guard", "4"], "guard"),
        (["--nats-url", "http://x"], "nats_url"),
        (["--preemption", "maybe"], "preemption"),
        (["--defrag", "yes"], "defrag"),
        (["--defrag-max-moves", "0"], "defrag_max_moves"),
        (["--defrag-moves-per-hour", "-1"], "defrag_moves_per_hour"),
        (["--defrag-cooldown-s", "-5"], "defrag_cooldown_s"),
        (["--drain", "maybe"], "drain"),
    ],
)
def test_bad_values_name_the_field(flags: list[str], field: str) -> None:
    with pytest.raises(SettingsError, match=f"^{field}:"):
        load(PlacementSettings, flags, {})


def test_guard() -> None:
    assert parse_guard("off") is None
    assert parse_guard("4:32") == Guard(4000, 32 * 1024)
    assert parse_guard("0.5:0") == Guard(500, 0)
