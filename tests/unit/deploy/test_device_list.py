"""What the manifests give the NVIDIA container toolkit: the plugin never falls back to the
forgeable NVIDIA_VISIBLE_DEVICES device list, and the inventory asks for its cards the way the
toolkit honours for an unprivileged container once env requests are refused."""

from __future__ import annotations

import pytest

from gpuledger_plugin.settings import PluginSettings

from .manifests import RENDERS, container_env, containers, rendered

DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"


@pytest.mark.parametrize("path", RENDERS)
def test_the_plugin_gives_cards_by_a_list_no_pod_can_forge(path: str) -> None:
    objects = rendered(path)
    plugins = [c for _, _, c in containers(objects) if c["name"] == "plugin"]
    assert plugins, path
    for plugin in plugins:
        strategy = container_env(objects, plugin).get("GPULEDGER_DEVICE_LIST_STRATEGY", "")
        chosen = strategy or PluginSettings.__dataclass_fields__["device_list_strategy"].default
        assert "env" not in str(chosen).split(","), f"{path}: the plugin's device list is {chosen!r}"


@pytest.mark.parametrize("path", ["base", "overlays/production"])
def test_the_inventory_asks_for_every_card_by_a_dev_null_mount(path: str) -> None:
    for _, spec, container in containers(rendered(path)):
        if container["name"] != "inventory":
            continue
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        mount = mounts[f"{DEVICE_LIST_ROOT}/all"]
        assert volumes[mount["name"]]["hostPath"] == {"path": "/dev/null", "type": "CharDevice"}
        assert mount["readOnly"] is True
        return
    raise AssertionError(f"{path}: no inventory container")
