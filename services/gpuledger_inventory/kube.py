"""The Kubernetes adapter: the one module that imports kubernetes_asyncio, behind ``NodeApi`` and
``SliceApi``.

``NodeApi``: read a Node's labels, and merge-patch them. ``SliceApi`` (DRA mode): list, create,
replace and delete the node's ResourceSlices, in raw JSON (``gpuledger_common.kuberaw``: the
client's models may lag ``resource.k8s.io/v1``), and read the Node's uid for the slices' owner.
Both take the client configuration loaded by ``gpuledger_common.kubeconfig`` (the ``kube``
setting). Without Kubernetes (``kube=off``, or ``auto`` outside a pod and with no kubeconfig) the
service runs without labelling; in DRA mode it needs Kubernetes and says so at start.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from gpuledger_common.kuberaw import RawKube
from gpuledger_core.errors import NotFound, Unavailable

log = logging.getLogger(__name__)


class NodeApi(Protocol):
    async def get_labels(self, node: str) -> dict[str, str]: ...
    async def patch_labels(self, node: str, patch: dict[str, str | None]) -> None: ...
    async def close(self) -> None: ...


class KubeNodeApi:
    def __init__(self, configuration: Any) -> None:
        from kubernetes_asyncio import client

        self._api_client = client.ApiClient(configuration)
        self._core = client.CoreV1Api(self._api_client)

    async def get_labels(self, node: str) -> dict[str, str]:
        try:
            found = await self._core.read_node(node)
        except Exception as err:
            raise _translate(err, node) from err
        return dict(found.metadata.labels or {})

    async def patch_labels(self, node: str, patch: dict[str, str | None]) -> None:
        body = {"metadata": {"labels": patch}}
        try:
            merge = "application/merge-patch+json"
            await self._core.patch_node(node, body, _content_type=merge)  # type: ignore[call-arg]
        except Exception as err:
            raise _translate(err, node) from err

    async def close(self) -> None:
        await self._api_client.close()


class SliceApi(Protocol):
    async def node_uid(self, node: str) -> str: ...
    async def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]: ...
    async def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def replace_slice(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def delete_slice(self, name: str) -> None: ...
    def watch_slices(self, node: str, driver: str) -> AsyncIterator[dict[str, Any]]: ...
    async def close(self) -> None: ...


SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class KubeSliceApi:
    """ResourceSlices through the API server, as raw JSON."""

    def __init__(self, configuration: Any) -> None:
        self._raw = RawKube(configuration)

    async def node_uid(self, node: str) -> str:
        found = await self._raw.call(f"node {node}", "GET", f"/api/v1/nodes/{node}")
        return str(found["metadata"]["uid"])

    async def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={node},spec.driver={driver}"
        found = await self._raw.call(
            f"the ResourceSlices of {node}", "GET", SLICES, params={"fieldSelector": selector}
        )
        return list(found.get("items") or [])

    async def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        return dict(await self._raw.call(f"ResourceSlice {name}", "POST", SLICES, body))

    async def replace_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        return dict(await self._raw.call(f"ResourceSlice {name}", "PUT", f"{SLICES}/{name}", body))

    async def delete_slice(self, name: str) -> None:
        try:
            await self._raw.call(f"ResourceSlice {name}", "DELETE", f"{SLICES}/{name}")
        except NotFound:
            return  # gone already: what was wanted

    def watch_slices(self, node: str, driver: str) -> AsyncIterator[dict[str, Any]]:
        """The events of the node's slices of ``driver`` from now on (the API server first sends
        those there as ADDED), until the API server ends the watch."""
        selector = f"spec.nodeName={node},spec.driver={driver}"
        return self._raw.watch(SLICES, {"fieldSelector": selector})

    async def close(self) -> None:
        await self._raw.close()


def _translate(err: Exception, node: str) -> Exception:
    if getattr(err, "status", None) == 404:
        return NotFound(f"node {node} does not exist in Kubernetes")
    return Unavailable(f"Kubernetes API: {err}")
