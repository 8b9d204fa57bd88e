"""The Kubernetes adapter: the one module of this service that imports kubernetes_asyncio.

Bind asks three things of the API server: read the pod, merge-patch its annotations, and create its
Binding (``POST /api/v1/namespaces/{ns}/pods/{name}/binding``). Responses are read raw (JSON as
the API server sent it), so the pod goes through the same conversion as the extender's pod, and the
client's model classes (which cannot decode a Binding's ``Status`` reply) stay out of the way.
HTTP errors become the gpuledger error that says what to do: 404 ``NotFound``, 409 ``Conflict``,
other 4xx ``FailedPrecondition``, 5xx and transport errors ``Unavailable``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from gpuledger_core.errors import Conflict, FailedPrecondition, GpuledgerError, NotFound, Unavailable

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"


class PodApi(Protocol):
    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...
    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None: ...
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...
    async def close(self) -> None: ...


class NoPodApi:
    """Kubernetes access switched off: the extender filters and scores, but cannot bind."""

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        raise FailedPrecondition("Kubernetes access is off (kube=off): this placement service cannot bind")

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        await self.get_pod(namespace, name)

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        await self.get_pod(namespace, name)

    async def close(self) -> None:
        return None


class KubePodApi:
    def __init__(self, api_client: Any, timeout_s: float) -> None:
        from kubernetes_asyncio import client

        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    @classmethod
    async def connect(cls, mode: str, kubeconfig: str, timeout_s: float) -> KubePodApi:
        """``mode``: in-cluster, kubeconfig, or auto (in-cluster when possible, else a kubeconfig)."""
        from kubernetes_asyncio import client, config

        try:
            if mode == "in-cluster":
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            elif mode == "kubeconfig" or kubeconfig:
                await config.load_kube_config(config_file=kubeconfig or None)
            else:
                await _auto(config)
        except Exception as err:  # configuration problems come in several unrelated types
            raise Unavailable(f"cannot configure Kubernetes access ({mode}): {err}") from err
        return cls(client.ApiClient(), timeout_s)

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        what = f"pod {namespace}/{name}"
        found = await self._call(what, self._core.read_namespaced_pod, name, namespace)
        if not isinstance(found, dict):
            raise Unavailable(f"the API server sent {what} in an unexpected form")
        return found

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        patch = self._core.patch_namespaced_pod
        await self._call(f"pod {namespace}/{name}", patch, name, namespace, body, _content_type=MERGE_PATCH)

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        create = self._core.create_namespaced_pod_binding
        await self._call(f"binding of pod {namespace}/{name} to {node}", create, name, namespace, body)

    async def close(self) -> None:
        await self._api_client.close()

    async def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            response = await method(*args, _preload_content=False, _request_timeout=self.timeout_s, **kwargs)
            status, data = response.status, await response.read()
            response.release()
        except GpuledgerError:
            raise
        except Exception as err:  # timeouts, refused connections, TLS: all mean "not now"
            raise Unavailable(f"Kubernetes API unreachable for {what}: {err or type(err).__name__}") from err
        body = _json(data)
        if 200 <= status < 300:
            return body
        raise http_error(status, what, body)


def http_error(status: int, what: str, body: Any) -> GpuledgerError:
    message = body.get("message") if isinstance(body, dict) else None
    detail = f"{what}: {message or f'HTTP {status}'}"
    if status == 404:
        return NotFound(detail)
    if status == 409:
        return Conflict(detail)
    if 400 <= status < 500 and status != 429:
        return FailedPrecondition(detail)
    return Unavailable(detail)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


async def _auto(config: Any) -> None:
    """In a pod, its service account; elsewhere, the default kubeconfig."""
    try:
        config.load_incluster_config()
    except Exception:  # not in a pod
        await config.load_kube_config()
