"""The Kubernetes adapter: the one module of this service that calls the API server.

Bind asks at most two things of the API server: read the pod (only when filter did not just see it),
and create its Binding (``POST /api/v1/namespaces/{ns}/pods/{name}/binding``), whose annotations the
API server copies onto the pod in the same write (so the allocation annotation and the node are set
together or not at all). Responses are read raw (JSON as
the API server sent it, over ``gpuledger_common.kuberaw``), so the pod goes through the same
conversion as the extender's pod, and the client's model classes (which cannot decode a Binding's
``Status`` reply) stay out of the way; the configuration comes loaded from
``gpuledger_common.kubeconfig`` (the ``kube`` setting).
HTTP errors become the gpuledger error that says what to do (``kuberaw.http_error``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from gpuledger_common.kuberaw import JSON, MERGE_PATCH, RawKube
from gpuledger_core.errors import FailedPrecondition, Unavailable

log = logging.getLogger(__name__)


class PodApi(Protocol):
    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...
    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None: ...
    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None: ...
    async def close(self) -> None: ...


class NoPodApi:
    """No Kubernetes access (kube off, or auto with none found): the extender filters and scores,
    but cannot bind."""

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        raise FailedPrecondition("no Kubernetes access (see the kube setting): this placement service cannot bind")

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        await self.get_pod(namespace, name)

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        await self.get_pod(namespace, name)

    async def close(self) -> None:
        return None


class KubePodApi:
    """Pods through the API server. ``configuration`` comes from ``kubeconfig.load`` (in-cluster or a
    kubeconfig, with its token refresh); the requests go over one aiohttp session of our own, with
    no proxy or netrc lookup per request (the library's session reads both from the environment on
    every call, in a thread): bind is on kube-scheduler's critical path."""

    def __init__(self, configuration: Any, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._raw = RawKube(configuration, timeout_s, connections=64)  # binds come in bursts

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        what = f"pod {namespace}/{name}"
        found = await self._call(what, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        if not isinstance(found, dict):
            raise Unavailable(f"the API server sent {what} in an unexpected form")
        return found

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        await self._call(f"pod {namespace}/{name}", "PATCH", path, body, MERGE_PATCH)

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/binding"
        await self._call(f"binding of pod {namespace}/{name} to {node}", "POST", path, body)

    async def close(self) -> None:
        await self._raw.close()

    async def list_objects(self, path: str, params: Mapping[str, str], timeout_s: float = 60.0) -> dict[str, Any]:
        """One LIST (``items`` and ``metadata.resourceVersion``), raw JSON."""
        found = await self._raw.call(f"list {path}", "GET", path, params=params, timeout_s=timeout_s)
        if not isinstance(found, dict) or not isinstance(found.get("items"), list):
            raise Unavailable(f"the API server sent the list of {path} in an unexpected form")
        return found

    def watch(self, path: str, params: Mapping[str, str], timeout_s: float = 300.0) -> AsyncIterator[dict[str, Any]]:
        """``RawKube.watch``: the events of one WATCH."""
        return self._raw.watch(path, params, timeout_s)

    async def get_object(self, path: str) -> dict[str, Any]:
        """One object, raw JSON."""
        return _object(await self._raw.call(f"get {path}", "GET", path), path)

    async def replace_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT ``body`` (its resourceVersion is the precondition: 409 ``Conflict`` if it changed)."""
        return _object(await self._raw.call(f"update {path}", "PUT", path, body), path)

    async def patch_object(self, path: str, body: Any, content_type: str) -> dict[str, Any]:
        """PATCH ``path`` (a JSON patch's ``test`` operations are its preconditions: 422 if one fails)."""
        return _object(await self._raw.call(f"patch {path}", "PATCH", path, body, content_type), path)

    async def create_object(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` to the collection ``path``."""
        return _object(await self._raw.call(f"create in {path}", "POST", path, body), path)

    async def _call(self, what: str, method: str, path: str, body: Any = None, content_type: str = JSON) -> Any:
        return await self._raw.call(what, method, path, body, content_type)


def _object(found: Any, path: str) -> dict[str, Any]:
    if not isinstance(found, dict):
        raise Unavailable(f"the API server sent {path} in an unexpected form")
    return found
