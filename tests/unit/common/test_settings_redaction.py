"""A NATS password in a URL never reaches the logs (the Kubernetes manifests put one there)."""

from __future__ import annotations

import pytest

from gpuledger_allocator.settings import AllocatorSettings
from gpuledger_common.settings import describe, load, redact_url
from gpuledger_plugin.settings import PluginSettings


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://gpuledger:s3cret@gpuledger-nats:4222", "nats://***@gpuledger-nats:4222"),
        ("tls://token@nats.example:4222/x", "tls://***@nats.example:4222/x"),
        ("nats://a:b@c@host:4222", "nats://***@host:4222"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins"),
        ("nats://host:4222/path@x", "nats://host:4222/path@x"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_startup_line_hides_the_nats_password() -> None:
    env = {"GPULEDGER_NATS_URL": "nats://gpuledger:s3cret@gpuledger-nats:4222", "GPULEDGER_NODE": "n1"}
    for settings in (load(AllocatorSettings, [], env), load(PluginSettings, [], env)):
        shown = describe(settings)
        assert shown["nats_url"] == "nats://***@gpuledger-nats:4222"
        assert "s3cret" not in repr(shown)
