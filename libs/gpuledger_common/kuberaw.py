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
from collections.abc import Mapping
from typing import Any

import aiohttp

from gpuledger_core.errors import Conflict, FailedPrecondition, GpuledgerError, NotFound, Unavailable

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class RawKube:
    def __init__(self, configuration: Any, timeout_s: float = 30.0) -> None:
        self._config = configuration
        self._server = str(configuration.host).rstrip("/")
        self._proxy = getattr(configuration, "proxy", None) or None
        self._server_name = getattr(configuration, "tls_server_name", None) or None
        connector = aiohttp.TCPConnector(limit=16, keepalive_timeout=60.0, ssl=ssl_context(configuration))
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
    ) -> Any:
        """One request; the decoded JSON answer, or the gpuledger error for its status."""
        try:
            headers = await self._headers(content_type)
            data = None if body is None else json.dumps(body, separators=(",", ":"))
            async with self._http.request(
                method,
                self._server + path,
                data=data,
                headers=headers,
                params=params,
                proxy=self._proxy,
                server_hostname=self._server_name,
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
