"""The Kubernetes adapter of DRA mode: the one plugin module that imports kubernetes_asyncio.

Two reads, in raw JSON (``gpuledger_common.kuberaw``): a ResourceClaim by namespace and name, and
this node's ResourceSlices of the driver (what the inventory published: the cards behind the
device names). kubernetes_asyncio only loads the configuration (in-cluster or a kubeconfig).
"""

from __future__ import annotations

from typing import Any, Protocol

from gpuledger_common.kuberaw import RawKube
from gpuledger_core.errors import Unavailable


class ClaimApi(Protocol):
    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def node_slices(self, node: str, driver: str) -> list[dict[str, Any]]: ...
    async def close(self) -> None: ...


class KubeClaimApi:
    def __init__(self, raw: RawKube) -> None:
        self._raw = raw

    @classmethod
    async def connect(cls, kubeconfig: str, timeout_s: float) -> KubeClaimApi:
        """In a pod, its service account; else ``kubeconfig`` (or the default one)."""
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        try:
            if kubeconfig:
                await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            else:
                try:
                    config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                except Exception:  # not in a pod
                    await config.load_kube_config(client_configuration=configuration)
        except Exception as err:  # configuration problems come in several unrelated types
            raise Unavailable(f"cannot configure Kubernetes access: {err}") from err
        return cls(RawKube(configuration, timeout_s))

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
