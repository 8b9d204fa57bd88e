"""The Role that ``kubectl gpuledger`` needs (base/viewer.yaml): ``get`` on the service proxy of the
allocator's HTTP port, by the names the plugin writes, in every rendering, bound to nobody by the
manifests (an administrator binds it to people), and the plugin's defaults are the manifests' names."""

from __future__ import annotations

import pytest

from gpuledger_cli import kubectl_plugin as plugin

from .manifests import NAMESPACE, RENDERS, named, of_kind, rendered


@pytest.mark.parametrize("path", RENDERS)
def test_the_viewer_role_grants_only_the_proxy_of_the_allocators_http_port(path: str) -> None:
    role = named(rendered(path), "Role", plugin.VIEWER_ROLE)
    assert role["metadata"]["namespace"] == NAMESPACE == plugin.GPULEDGER_NAMESPACE
    proxied = plugin.Allocator().proxy_path("/api/cluster").split("/services/")[1].split("/")[0]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["services/proxy"],
            "resourceNames": [proxied, proxied.removeprefix("http:")],
            "verbs": ["get"],
        }
    ]


@pytest.mark.parametrize("path", RENDERS)
def test_the_plugins_defaults_name_the_allocators_service_and_port(path: str) -> None:
    service = named(rendered(path), "Service", plugin.SERVICE)
    assert service["metadata"]["namespace"] == plugin.GPULEDGER_NAMESPACE
    assert plugin.PORT in [p["name"] for p in service["spec"]["ports"]]


@pytest.mark.parametrize("path", RENDERS)
def test_nothing_in_the_manifests_binds_the_viewer_role(path: str) -> None:
    for binding in of_kind(rendered(path), "RoleBinding"):
        assert binding["roleRef"]["name"] != plugin.VIEWER_ROLE
