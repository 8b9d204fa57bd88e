"""The Kubernetes adapter of DRA mode: the one plugin module that calls the API server.

Two reads, in raw JSON (``gpuledger_common.kuberaw``): a ResourceClaim by namespace and name, and
this node's ResourceSlices of the driver (what the inventory published: the cards behind the
device names). The client configuration comes loaded from ``gpuledger_common.kubeconfig`` (the
``kube`` setting).
"""

from __future__ import annotations

from typing import Any, Protocol

from gpuledger_common.kuberaw import RawKube


class ClaimApi(Protocol):
    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def node_slices(self, node: str, driver: str) -> list[dict[str, Any]]: ...
    async def close(self) -> None: ...


class KubeClaimApi:
    def __init__(self, configuration: Any, timeout_s: float) -> None:
        self._raw = RawKube(configuration, timeout_s)

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        return dict(await self._raw.call(f"ResourceClaim {namespace}/{name}", "GET", path))

    async def node_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        found = await self._raw.call(
            f"the ResourceSlices of {node}",
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices",
            params={"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"},
        )
        return list(found.get("items") or [])

    async def close(self) -> None:
        await self._raw.close()
