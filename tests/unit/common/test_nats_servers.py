"""Every service and the CLI take a list of NATS servers in ``nats_url``, checked by one helper:
a bad entry is named (password hidden), never a traceback; passwords stay out of the logs."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_allocator.__main__ import main as allocator_main
from gpuledger_allocator.settings import AllocatorSettings
from gpuledger_cli.__main__ import main as cli_main
from gpuledger_common.settings import SettingsError, describe, load, nats_servers, redact_url
from gpuledger_inventory.settings import InventorySettings
from gpuledger_placement.settings import PlacementSettings
from gpuledger_plugin.dra.settings import DraSettings
from gpuledger_plugin.settings import PluginSettings

THREE = "nats://u:pw@n0:4222,nats://u:pw@n1:4222,nats://u:pw@n2:4222"


@pytest.mark.parametrize(
    ("raw", "servers"),
    [
        ("nats://127.0.0.1:4222", ("nats://127.0.0.1:4222",)),
        ("nats://a:4222,nats://b:4222", ("nats://a:4222", "nats://b:4222")),
        (" nats://a:4222 , tls://b ", ("nats://a:4222", "tls://b")),
        ("ws://a:80,wss://b:443", ("ws://a:80", "wss://b:443")),
        (THREE, tuple(THREE.split(","))),
    ],
)
def test_a_list_of_servers_is_accepted(raw: str, servers: tuple[str, ...]) -> None:
    assert nats_servers(raw) == servers


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "nats_url: must name at least one server"),
        ("http://a:4222", "nats_url: the URL ('http://a:4222') must start with nats://"),
        ("nats://a:4222,http://b", "nats_url: entry 2 of 2 ('http://b') must start with nats://"),
        ("nats://a,,nats://b", "nats_url: entry 2 of 3 ('') is empty"),
        ("nats://a,", "nats_url: entry 2 of 2 ('') is empty"),
        ("nats://a:99999", "nats_url: the URL ('nats://a:99999') has a port that is not a number"),
        ("nats://a:x", "nats_url: the URL ('nats://a:x') has a port that is not a number"),
        ("nats://:4222", "nats_url: the URL ('nats://:4222') names no host"),
        ("nats://a:4222/path", "nats_url: the URL ('nats://a:4222/path') must be scheme://"),
        ("nats://a:1,nats://u:secret@b:x", "nats_url: entry 2 of 2 ('nats://***@b:x') has a port"),
        ("nats://a,ws://b", "nats_url: mixes websocket"),
    ],
)
def test_a_bad_entry_is_named(raw: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        nats_servers(raw)
    assert str(caught.value).startswith(message)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("kind", [AllocatorSettings, PlacementSettings, PluginSettings, InventorySettings, DraSettings])
def test_every_service_takes_the_list_from_flag_and_environment(kind: Any) -> None:
    env = {"GPULEDGER_NATS_URL": THREE, "GPULEDGER_NODE": "n1"}
    assert load(kind, [], env).nats_url == THREE
    assert load(kind, ["--nats-url", "nats://a:1,nats://b:2"], env).nats_url == "nats://a:1,nats://b:2"
    with pytest.raises(SettingsError, match=r"^nats_url: entry 2 of 2"):
        load(kind, ["--nats-url", "nats://a:1,b:2"], env)
    shown = describe(load(kind, [], env))
    assert shown["nats_url"] == "nats://***@n0:4222,nats://***@n1:4222,nats://***@n2:4222"


def test_a_bad_list_stops_the_allocator_with_a_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert allocator_main(["--nats-url", "nats://a:4222,nats//b:4222"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuledger-allocator: bad setting: nats_url: entry 2 of 2 ('nats//b:4222') must start")
    assert "Traceback" not in err


def test_the_cli_names_a_bad_entry(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["health", "--nats-url", "nats://a:4222,tcp://b", "--node", "n", "--card", "0", "--healthy"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--nats-url: entry 2 of 2 ('tcp://b') must start with nats://" in err


def test_a_list_is_redacted_entry_by_entry() -> None:
    assert redact_url("nats://a:b@h1:1,nats://h2:2") == "nats://***@h1:1,nats://h2:2"
