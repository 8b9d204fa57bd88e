"""The shipped kube-scheduler configuration: kube-scheduler's validation rules, and agreement with
the placement service's routes and settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from gpuledger_placement.app import build
from gpuledger_placement.kube import NoPodApi
from gpuledger_placement.settings import PlacementSettings

CONFIG = Path(__file__).parents[3] / "deploy" / "scheduler" / "scheduler-config.yaml"
QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$")


def extended_resource_name(name: str) -> bool:
    """``IsExtendedResourceName``: a prefixed qualified name outside kubernetes.io, not ``requests.``."""
    prefix, sep, rest = name.partition("/")
    if not sep or not DNS_SUBDOMAIN.match(prefix) or len(prefix) > 253:
        return False
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io") or name.startswith("requests."):
        return False
    return bool(QUALIFIED.match(rest)) and len(rest) <= 63


def seconds(duration: str) -> float:
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * units[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(ns|us|ms|s|m|h)", duration))


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    return loaded


@pytest.fixture(scope="module")
def extender(config: dict[str, Any]) -> dict[str, Any]:
    [only] = config["extenders"]
    found: dict[str, Any] = only
    return found


def test_it_is_a_v1_scheduler_configuration(config: dict[str, Any]) -> None:
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"


def test_kube_scheduler_validation_rules(config: dict[str, Any]) -> None:
    binders = [e for e in config["extenders"] if e.get("bindVerb")]
    assert len(binders) <= 1, "only one extender can implement bind"
    for e in config["extenders"]:
        assert e.get("urlPrefix"), "urlPrefix is required"
        if e.get("prioritizeVerb"):
            assert int(e.get("weight", 0)) > 0, "prioritizeVerb requires a positive weight"
        names = [r["name"] for r in e.get("managedResources", [])]
        assert len(names) == len(set(names)), "managedResources repeat a name"
        for name in names:
            assert extended_resource_name(name), f"{name} is not a valid extended resource name"
        if "httpTimeout" in e:
            assert DURATION.match(e["httpTimeout"]), "httpTimeout must be a Go duration"


def test_the_extender_is_node_cache_capable_and_not_ignorable(extender: dict[str, Any]) -> None:
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False


def test_every_pod_of_the_profile_reaches_the_extender(extender: dict[str, Any]) -> None:
    assert not extender.get("managedResources")  # empty: interested in every pod (the guard sees CPU-only pods)


def test_only_card_count_is_checked_by_the_scheduler_itself(config: dict[str, Any]) -> None:
    (profile,) = config["profiles"]
    (fit,) = [p for p in profile["pluginConfig"] if p["name"] == "NodeResourcesFit"]
    assert fit["args"]["ignoredResources"] == ["gpuledger.io/gpu-mem", "gpuledger.io/gpu-core"]  # not gpuledger.io/gpu


def test_the_verbs_and_prefix_are_what_placement_serves(extender: dict[str, Any]) -> None:
    defaults = PlacementSettings()
    url = urlparse(extender["urlPrefix"])
    assert url.scheme == "https" and extender["enableHTTPS"] is True
    assert url.port == defaults.extender_port
    assert url.path == defaults.url_prefix
    parts = build(PlacementSettings(kube="off"), None, NoPodApi(), None)
    served = {route.path for route in parts.extender.routes(defaults.url_prefix)}
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb"):
        assert f"{url.path}/{extender[verb]}" in served


def test_the_scheduler_presents_a_client_certificate_and_checks_the_server(extender: dict[str, Any]) -> None:
    tls = extender["tlsConfig"]
    assert set(tls) == {"certFile", "keyFile", "caFile"}  # ExtenderTLSConfig's json names, no insecure
    assert len({Path(f).parent for f in tls.values()}) == 1  # one mounted Secret


def test_the_timeout_leaves_bind_room_for_its_api_calls(extender: dict[str, Any]) -> None:
    # get (unless filter just saw the pod), the Binding, a re-read after a failed Binding, and the
    # ledger write with the outage it may wait out
    settings = PlacementSettings()
    budget = 3 * settings.kube_timeout_s + settings.ledger_retry_s
    assert seconds(extender["httpTimeout"]) >= budget
