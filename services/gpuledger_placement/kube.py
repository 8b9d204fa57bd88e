"""The Kubernetes adapter: the one module of this service that imports kubernetes_asyncio.

Bind asks at most two things of the API server: read the pod (only when filter did not just see it),
and create its Binding (``POST /api/v1/namespaces/{ns}/pods/{name}/binding``), whose annotations the
API server copies onto the pod in the same write (so the allocation annotation and the node are set
together or not at all). Responses are read raw (JSON as
the API server sent it), so the pod goes through the same conversion as the extender's pod, and the
client's model classes (which cannot decode a Binding's ``Status`` reply) stay out of the way;
kubernetes_asyncio only loads the configuration.
HTTP errors become the gpuledger error that says what to do: 404 ``NotFound``, 409 ``Conflict``,
other 4xx ``FailedPrecondition``, 5xx and transport errors ``Unavailable``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import orjson

from gpuledger_common.kuberaw import http_error, json_of, ssl_context
from gpuledger_core.errors import FailedPrecondition, GpuledgerError, Unavailable

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
JSON = "application/json"


class PodApi(Protocol):
    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...
    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None: ...
    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None: ...
    async def close(self) -> None: ...


class NoPodApi:
    """Kubernetes access switched off: the extender filters and scores, but cannot bind."""

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        raise FailedPrecondition("Kubernetes access is off (kube=off): this placement service cannot bind")

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        await self.get_pod(namespace, name)

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        await self.get_pod(namespace, name)

    async def close(self) -> None:
        return None


class KubePodApi:
    """Pods through the API server. kubernetes_asyncio loads the configuration (in-cluster or a
    kubeconfig, with its token refresh); the requests go over one aiohttp session of our own, with
    no proxy or netrc lookup per request (the library's session reads both from the environment on
    every call, in a thread): bind is on kube-scheduler's critical path."""

    def __init__(self, configuration: Any, timeout_s: float) -> None:
        self._config = configuration
        self.timeout_s = timeout_s
        self._server = str(configuration.host).rstrip("/")
        self._proxy = configuration.proxy or None
        self._server_name = getattr(configuration, "tls_server_name", None) or None  # kubeconfig tls-server-name
        # Idle connections are kept 60 s (the API server closes them after 90 s): a TLS handshake
        # costs both sides more than a Binding, and binds come in bursts seconds apart.
        connector = aiohttp.TCPConnector(limit=64, keepalive_timeout=60.0, ssl=ssl_context(configuration))
        self._http = aiohttp.ClientSession(
            connector=connector, trust_env=False, timeout=aiohttp.ClientTimeout(total=timeout_s)
        )

    @classmethod
    async def connect(cls, mode: str, kubeconfig: str, timeout_s: float) -> KubePodApi:
        """``mode``: in-cluster, kubeconfig, or auto (in-cluster when possible, else a kubeconfig)."""
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        try:
            if mode == "in-cluster":
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            elif mode == "kubeconfig" or kubeconfig:
                await config.load_kube_config(config_file=kubeconfig or None, client_configuration=configuration)
            else:
                await _auto(config, configuration)
        except Exception as err:  # configuration problems come in several unrelated types
            raise Unavailable(f"cannot configure Kubernetes access ({mode}): {err}") from err
        return cls(configuration, timeout_s)

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
        await self._http.close()

    async def list_objects(self, path: str, params: Mapping[str, str], timeout_s: float = 60.0) -> dict[str, Any]:
        """One LIST (``items`` and ``metadata.resourceVersion``), raw JSON."""
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
        found = await self._call(f"list {path}", "GET", f"{path}?{query}", timeout_s=timeout_s)
        if not isinstance(found, dict) or not isinstance(found.get("items"), list):
            raise Unavailable(f"the API server sent the list of {path} in an unexpected form")
        return found

    async def watch(
        self, path: str, params: Mapping[str, str], timeout_s: float = 300.0
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of one WATCH from ``params['resourceVersion']`` (``type`` and ``object``),
        until the API server ends it (after ``timeout_s``); a ``GpuledgerError`` when it fails (410:
        the version is gone, list again)."""
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in {**params, "watch": "1"}.items())
        query += f"&timeoutSeconds={int(timeout_s)}&allowWatchBookmarks=true"
        try:
            headers = await self._headers(JSON)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=timeout_s + 30)
            async with self._http.get(
                f"{self._server}{path}?{query}",
                headers=headers,
                proxy=self._proxy,
                server_hostname=self._server_name,
                timeout=timeout,
            ) as response:
                if response.status != 200:
                    raise http_error(response.status, f"watch {path}", json_of(await response.read()))
                async for line in response.content:
                    event = _event(line)
                    if not isinstance(event, dict):
                        continue
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise http_error(int(status.get("code") or 500), f"watch {path}", status)
                    yield event
        except GpuledgerError:
            raise
        except Exception as err:
            raise Unavailable(f"the watch of {path} broke: {err or type(err).__name__}") from err

    async def _headers(self, content_type: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        auth = await self._config.auth_settings()  # runs the configuration's token refresh, if any
        token = auth.get("BearerToken", {}).get("value")
        if token:
            headers["Authorization"] = str(token)
        return headers

    async def _call(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        timeout_s: float | None = None,
    ) -> Any:
        try:
            headers = await self._headers(content_type)
            data = None if body is None else json.dumps(body, separators=(",", ":"))
            async with self._http.request(
                method,
                self._server + path,
                data=data,
                headers=headers,
                proxy=self._proxy,
                server_hostname=self._server_name,
                timeout=aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None,
            ) as response:
                status, raw = response.status, await response.read()
        except GpuledgerError:
            raise
        except Exception as err:  # timeouts, refused connections, TLS: all mean "not now"
            raise Unavailable(f"Kubernetes API unreachable for {what}: {err or type(err).__name__}") from err
        found = json_of(raw)
        if 200 <= status < 300:
            return found
        raise http_error(status, what, found)


async def _auto(config: Any, configuration: Any) -> None:
    """In a pod, its service account; elsewhere, the default kubeconfig."""
    try:
        config.load_incluster_config(client_configuration=configuration)
    except Exception:  # not in a pod
        await config.load_kube_config(client_configuration=configuration)


def _event(line: bytes) -> Any:
    """One watch event (orjson: the guard's pod watch decodes every bound pod's changes)."""
    try:
        return orjson.loads(line) if line.strip() else None
    except orjson.JSONDecodeError:
        return None
