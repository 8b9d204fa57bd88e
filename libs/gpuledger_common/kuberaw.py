"""Raw JSON calls to the Kubernetes API server over one aiohttp session.

For objects newer than the client library's models (``resource.k8s.io/v1`` of Kubernetes 1.36):
a model that lags drops the fields it does not know on read-modify-write, so these objects are
read and written as the API server sends them. The caller's ``kube.py`` loads the configuration
with kubernetes_asyncio (in-cluster or a kubeconfig, with its token refresh) and hands it here;
this module only reads its attributes (``host``, ``ssl_ca_cert``, ``cert_file``, ``key_file``,
``verify_ssl``, ``proxy``, ``auth_settings()``).

HTTP errors become the gpuledger error that says what to do: 404 ``NotFound``, 409 ``Conflict``,
other 4xx ``FailedPrecondition``, 5xx, 429 and transport errors ``Unavailable``.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson

from gpuledger_core.errors import Conflict, FailedPrecondition, GpuledgerError, NotFound, Unavailable

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class RawKube:
    """``connections``: the most kept open at once. Idle ones are kept 60 s (the API server closes
    them after 90 s): a TLS handshake costs both sides more than most requests."""

    def __init__(self, configuration: Any, timeout_s: float = 30.0, connections: int = 16) -> None:
        self._config = configuration
        self.timeout_s = timeout_s
        self._server = str(configuration.host).rstrip("/")
        self._proxy = getattr(configuration, "proxy", None) or None
        self._server_name = getattr(configuration, "tls_server_name", None) or None  # kubeconfig tls-server-name
        connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=60.0, ssl=ssl_context(configuration))
        self._http = aiohttp.ClientSession(
            connector=connector, trust_env=False, timeout=aiohttp.ClientTimeout(total=timeout_s)
        )

    async def close(self) -> None:
        await self._http.close()

    async def call(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        params: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One request; the decoded JSON answer, or the gpuledger error for its status.
        ``timeout_s``: this request's own limit (else the session's)."""
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        status, raw = await self.request(what, method, path, data, content_type, params, timeout_s)
        found = json_of(raw)
        if 200 <= status < 300:
            return found
        raise http_error(status, what, found)

    async def request(
        self,
        what: str,
        method: str,
        path: str,
        data: str | None = None,
        content_type: str = JSON,
        params: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, bytes]:
        """One request; its status and body as they came, whatever the status (for a caller that
        tells statuses apart itself, as a path through the API server's proxy must). Only a request
        that gets no answer raises: ``Unavailable``."""
        try:
            headers = await self._headers(content_type)
            async with self._http.request(
                method,
                self._server + path,
                data=data,
                headers=headers,
                params=params,
                proxy=self._proxy,
                server_hostname=self._server_name,
                timeout=aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None,
            ) as response:
                return response.status, await response.read()
        except GpuledgerError:
            raise
        except Exception as err:  # timeouts, refused connections, TLS: all mean "not now"
            raise Unavailable(f"Kubernetes API unreachable for {what}: {err or type(err).__name__}") from err

    async def watch(
        self, path: str, params: Mapping[str, str], timeout_s: float = 300.0
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of one WATCH from ``params['resourceVersion']`` (``type`` and ``object``),
        until the API server ends it (after ``timeout_s``); a ``GpuledgerError`` when it fails (410:
        the version is gone, list again). Events are decoded with orjson: a watch of pods brings
        every change of every pod."""
        query = {**params, "watch": "1", "timeoutSeconds": str(int(timeout_s)), "allowWatchBookmarks": "true"}
        try:
            headers = await self._headers(JSON)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=timeout_s + 30)
            async with self._http.get(
                self._server + path,
                params=query,
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
        headers = {"Accept": JSON, "Content-Type": content_type}
        auth = await self._config.auth_settings()  # runs the configuration's token refresh, if any
        token = auth.get("BearerToken", {}).get("value")
        if token:
            headers["Authorization"] = str(token)
        return headers


def ssl_context(configuration: Any) -> ssl.SSLContext | bool:
    """TLS as the configuration says (the CA, a client certificate, verification)."""
    if not str(configuration.host).startswith("https"):
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


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


def json_of(data: bytes) -> Any:
    """A response body as JSON (None when empty or not JSON)."""
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


def _event(line: bytes) -> Any:
    try:
        return orjson.loads(line) if line.strip() else None
    except orjson.JSONDecodeError:
        return None
