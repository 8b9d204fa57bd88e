"""``kubectl gpuledger`` (the ``kubectl-gpuledger`` console script): what ``gpuledger inspect`` shows,
and ``top`` (granted against used), for the user's namespace by default, read from the allocator
through the API server's service proxy with the user's own kubeconfig and RBAC: no port to open, no
credential of gpuledger's. The Role ``gpuledger-viewer`` grants what it needs (docs/kubectl-plugin.md).
The views are kubectl_view.py's; this module finds the user's access, asks, and says what went wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from gpuledger_cli import kubectl_view as view
from gpuledger_common.kubeconfig import UserAccess, for_user
from gpuledger_common.kuberaw import RawKube, json_of
from gpuledger_common.settings import SettingsError
from gpuledger_core import codec_status
from gpuledger_core.errors import GpuledgerError, InvalidArgument, NotFound, PermissionDenied, Unavailable
from gpuledger_core.status import NodeStatus

# Where deploy/kubernetes puts the allocator (base/allocator.yaml) and the Role for readers (base/viewer.yaml).
GPULEDGER_NAMESPACE = "gpuledger"
SERVICE = "gpuledger-allocator"
PORT = "http"
VIEWER_ROLE = "gpuledger-viewer"
DEFAULT_KUBECONFIG = os.path.join("~", ".kube", "config")
TIMEOUT_S = 30.0
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a namespace's, a Service's, a port's name (or number)
EXIT_CODES = {"invalid_argument": 2, "not_found": 3, "permission_denied": 4, "unavailable": 5}


@dataclass(frozen=True, slots=True)
class Allocator:
    """The allocator's Service, as the API server's service proxy reaches it."""

    namespace: str = GPULEDGER_NAMESPACE
    service: str = SERVICE
    port: str = PORT

    def __post_init__(self) -> None:
        for name in ("namespace", "service", "port"):
            value = getattr(self, name)
            if not NAME.fullmatch(value):
                raise InvalidArgument(f"--gpuledger-{name}", f"must be a Kubernetes name (a DNS label), got {value!r}")

    def proxy_path(self, path: str) -> str:
        """``path`` of the allocator's HTTP port, through the API server."""
        return f"/api/v1/namespaces/{self.namespace}/services/http:{self.service}:{self.port}/proxy{path}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl gpuledger",
        description="gpuledger's cards, as `gpuledger inspect` shows them, read from the allocator through the "
        "Kubernetes API server with your kubeconfig: the cards your namespace's pods hold (-A: every card), "
        "or `top`: what each holder was granted against what it uses.",
    )
    p.add_argument(
        "view", nargs="?", choices=["inspect", "top"], default="inspect", help="what to show (default inspect)"
    )
    p.add_argument("-n", "--namespace", default="", help="the namespace whose holders to show (default: the context's)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every holder, tools outside Kubernetes too")
    p.add_argument("--node", default="", help="only this node")
    p.add_argument("--model", default="", help="only cards of this model")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table", help="table (default) or json")
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG,
        help="kubeconfig file(s), joined by ':' (default $KUBECONFIG, else ~/.kube/config)",
    )
    p.add_argument("--context", default="", help="the kubeconfig context (default: the current one)")
    p.add_argument("--gpuledger-namespace", default=GPULEDGER_NAMESPACE, help="where gpuledger runs (%(default)s)")
    p.add_argument("--gpuledger-service", default=SERVICE, help="the allocator's Service (%(default)s)")
    p.add_argument(
        "--gpuledger-port", default=PORT, help="the Service's port of the allocator's HTTP API (%(default)s)"
    )
    p.add_argument("--request-timeout", type=float, default=TIMEOUT_S, help="seconds to wait (%(default)g)")
    return p


def scope_of(args: argparse.Namespace, access: UserAccess) -> view.Scope:
    """kubectl's rule: -A, else -n, else the context's namespace, else ``default``."""
    if args.all_namespaces:
        return view.Scope()
    return view.Scope(args.namespace or access.namespace or "default")


async def cluster(access: UserAccess, where: Allocator, node: str, model: str, timeout_s: float) -> list[NodeStatus]:
    """The allocator's ``GET /api/cluster`` (dashboard.py), through the API server."""
    params = {k: v for k, v in (("node", node), ("model", model)) if v}
    kube = RawKube(access.configuration, timeout_s=timeout_s, connections=1)
    try:
        status, body = await kube.request(
            "the allocator's cluster", "GET", where.proxy_path("/api/cluster"), params=params
        )
    finally:
        await kube.close()
    if status != 200:
        raise proxy_error(status, body, where, access)
    return decode(body)


def decode(body: bytes) -> list[NodeStatus]:
    found = json_of(body)
    try:
        return [codec_status.node_status_from(n) for n in found["nodes"]]
    except (GpuledgerError, KeyError, TypeError, ValueError) as err:
        raise GpuledgerError(f"the allocator's answer is not the cluster's status: {err}") from err


def proxy_error(status: int, body: bytes, where: Allocator, access: UserAccess) -> GpuledgerError:
    """What went wrong on the way to the allocator, and what to do about it."""
    found = json_of(body)
    from_api = isinstance(found, dict) and found.get("kind") == "Status"  # the API server's own answer
    said = str(found.get("message") or "") if from_api and isinstance(found, dict) else ""
    said = said or body.decode(errors="replace").strip()[:300] or f"HTTP {status}"
    service = f"service {where.service} in namespace {where.namespace}"
    if status == 401:
        return PermissionDenied(f"the API server did not accept the credentials of context {access.context}: {said}")
    if status == 403:
        return PermissionDenied(forbidden(said, where))
    if status == 404 and from_api:
        return NotFound(
            f"{said}: no {service}; is gpuledger installed there? (--gpuledger-namespace, --gpuledger-service)"
        )
    if status in (502, 503, 504):
        return Unavailable(
            f"the allocator cannot be reached through the API server ({service}, port {where.port}): {said}. "
            f"Are its pods ready? kubectl -n {where.namespace} get pods -l app.kubernetes.io/name={where.service}"
        )
    return GpuledgerError(f"the allocator answered HTTP {status} through the API server: {said}")


def forbidden(said: str, where: Allocator) -> str:
    return (
        f"{said}\nkubectl gpuledger needs `get` on services/proxy of the service {where.service} in the namespace "
        f"{where.namespace}. The Role {VIEWER_ROLE} there grants it; ask an administrator to bind it to you:\n"
        f"  kubectl -n {where.namespace} create rolebinding {VIEWER_ROLE}-<you> --role {VIEWER_ROLE} --user <you>\n"
        "(or --group, --serviceaccount; docs/kubectl-plugin.md)"
    )


async def run(args: argparse.Namespace) -> int:
    where = Allocator(args.gpuledger_namespace, args.gpuledger_service, args.gpuledger_port)
    if args.request_timeout <= 0:
        raise InvalidArgument("--request-timeout", f"must be more than 0 seconds, got {args.request_timeout:g}")
    access = await for_user(args.kubeconfig, args.context)
    scope = scope_of(args, access)
    nodes = await cluster(access, where, args.node, args.model, args.request_timeout)
    print(show(args.view, args.output, nodes, scope))
    return 0


def show(what: str, output: str, nodes: list[NodeStatus], scope: view.Scope) -> str:
    if what == "top":
        rows = view.top_rows(nodes, scope)
        return _json(view.top_json(rows, scope)) if output == "json" else view.top_text(rows, scope)
    return _json(view.inspect_json(nodes, scope)) if output == "json" else view.inspect_text(nodes, scope)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(run(args))
    except SettingsError as err:
        print(f"kubectl gpuledger: {err}", file=sys.stderr)
        return 2
    except InvalidArgument as err:
        print(f"kubectl gpuledger: invalid {err}", file=sys.stderr)
        return 2
    except GpuledgerError as err:
        print(f"kubectl gpuledger: {err}", file=sys.stderr)
        return EXIT_CODES.get(err.code, 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
