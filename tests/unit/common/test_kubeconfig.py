"""Kubernetes access: one vocabulary of modes in every service, ``auto`` resolved one way (from the
pod's files and environment and the settings), and the configuration loaded by the real client,
with an error naming the setting when it cannot be."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuledger_allocator.settings import AllocatorSettings
from gpuledger_common.kubeconfig import (
    MODES,
    KubeClientSettings,
    Mode,
    Pod,
    from_file,
    in_cluster,
    load,
    load_required,
    resolve,
)
from gpuledger_common.settings import SettingsError
from gpuledger_common.settings import load as load_settings
from gpuledger_inventory.settings import InventorySettings
from gpuledger_placement.settings import PlacementSettings
from gpuledger_plugin.dra.settings import DraSettings
from gpuledger_plugin.settings import PluginSettings

HOST = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def pod(tmp_path: Path, token: bool, env: dict[str, str]) -> Pod:
    directory = tmp_path / "serviceaccount"
    directory.mkdir(exist_ok=True)
    if token:
        (directory / "token").write_text("the-token")
        (directory / "ca.crt").write_text("not read until a call is made\n")
    return Pod(directory, env)


@pytest.mark.parametrize(
    ("env", "token", "mode", "kubeconfig", "resolved"),
    [
        (HOST, True, "auto", "", Mode.IN_CLUSTER),
        (HOST, True, "auto", "/k", Mode.IN_CLUSTER),  # in a pod, the pod's own account first
        (HOST, False, "auto", "", Mode.OFF),  # the variable alone is not a pod
        (HOST, False, "auto", "/k", Mode.KUBECONFIG),
        ({}, True, "auto", "", Mode.OFF),  # a token file alone is not a pod either
        ({}, True, "auto", "/k", Mode.KUBECONFIG),
        ({"KUBERNETES_SERVICE_HOST": ""}, True, "auto", "", Mode.OFF),
        ({"KUBECONFIG": "/k"}, False, "auto", "", Mode.OFF),  # $KUBECONFIG alone does not turn auto on
        ({}, False, "auto", "/k", Mode.KUBECONFIG),
        ({}, False, "auto", "", Mode.OFF),
        ({}, False, "in-cluster", "", Mode.IN_CLUSTER),  # a mode asked for is taken as asked
        (HOST, True, "kubeconfig", "", Mode.KUBECONFIG),
        (HOST, True, "off", "/k", Mode.OFF),
    ],
)
def test_each_mode_resolves_from_the_pod_and_the_settings(
    tmp_path: Path, env: dict[str, str], token: bool, mode: str, kubeconfig: str, resolved: Mode
) -> None:
    assert resolve(mode, kubeconfig, pod(tmp_path, token, env)) is resolved


def test_in_a_pod_means_the_token_and_the_host_variable(tmp_path: Path) -> None:
    assert in_cluster(pod(tmp_path, True, HOST))
    assert not in_cluster(pod(tmp_path, True, {}))
    assert not in_cluster(Pod(tmp_path / "elsewhere", HOST))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("on", "kube: 'on' is not a mode; use in-cluster or kubeconfig"),
        ("maybe", "kube: must be one of auto, in-cluster, kubeconfig or off, got 'maybe'"),
        ("In-Cluster", "kube: must be one of auto, in-cluster, kubeconfig or off, got 'In-Cluster'"),
    ],
)
def test_a_value_outside_the_vocabulary_is_named(value: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        resolve(value, "")
    assert str(caught.value) == message


KUBE_SERVICES = [AllocatorSettings, PlacementSettings, InventorySettings, DraSettings]


@pytest.mark.parametrize("kind", KUBE_SERVICES)
def test_every_service_that_reaches_kubernetes_takes_the_one_vocabulary(kind: type[KubeClientSettings]) -> None:
    assert issubclass(kind, KubeClientSettings)
    base = {f.name: f for f in dataclasses.fields(KubeClientSettings)}
    for name in ("kube", "kubeconfig"):
        field = next(f for f in dataclasses.fields(kind) if f.name == name)
        assert (field.default, field.metadata) == (base[name].default, base[name].metadata)  # declared once
    env = {"GPULEDGER_NODE": "n1"}
    for mode in MODES:
        if kind is DraSettings and mode == "off":
            continue  # the DRA plugin needs Kubernetes: refused below
        assert load_settings(kind, ["--kube", mode], env).kube == mode
        assert load_settings(kind, [], {**env, "GPULEDGER_KUBE": mode}).kube == mode
    with pytest.raises(SettingsError, match=r"^kube: 'on' is not a mode; use in-cluster or kubeconfig$"):
        load_settings(kind, ["--kube", "on"], env)


def test_services_without_kubernetes_have_no_kube_setting() -> None:
    assert "kube" not in {f.name for f in dataclasses.fields(PluginSettings)}


def test_the_dra_plugin_refuses_kube_off() -> None:
    with pytest.raises(SettingsError, match=r"^kube: the DRA plugin reads claims from the API server"):
        DraSettings(node="n1", kube="off")


async def test_in_cluster_loads_the_pods_service_account(tmp_path: Path) -> None:
    configuration = await load("auto", "", pod(tmp_path, True, HOST))
    assert configuration is not None
    assert configuration.host == "https://10.96.0.1:443"
    assert configuration.api_key == {"BearerToken": "Bearer the-token"}
    assert configuration.ssl_ca_cert == str(tmp_path / "serviceaccount" / "ca.crt")


async def test_a_kubeconfig_is_loaded_from_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    configuration = await load("auto", str(path), pod(tmp_path, False, {}))
    assert configuration is not None and configuration.host == "https://127.0.0.1:6443"
    assert (await from_file(str(path))).host == "https://127.0.0.1:6443"


async def test_off_loads_nothing(tmp_path: Path) -> None:
    assert await load("off", "/nowhere", pod(tmp_path, True, HOST)) is None
    assert await load("auto", "", pod(tmp_path, False, {})) is None


async def test_a_mode_that_cannot_be_loaded_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"^kube: in-cluster, but the pod's service account cannot be used"):
        await load("in-cluster", "", pod(tmp_path, False, {}))
    with pytest.raises(SettingsError, match=r"^kubeconfig: cannot load '/nowhere/kubeconfig'"):
        await load("kubeconfig", "/nowhere/kubeconfig", pod(tmp_path, False, {}))


async def test_a_service_that_needs_kubernetes_says_so_at_start(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        await load_required("auto", "", "the DRA plugin", pod(tmp_path, False, {}))
    assert str(caught.value).startswith(
        "kube: the DRA plugin needs Kubernetes, but kube is auto and found no pod's service account"
    )
    assert "set kube to in-cluster, or kubeconfig" in str(caught.value)
