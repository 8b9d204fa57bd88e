"""``kubectl gpuledger``: the user's access found as kubectl finds it, the allocator asked through a
(fake) API server's service proxy with the user's token, and each way that can fail said with what to
do about it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuledger_cli import kubectl_plugin as plugin
from gpuledger_cli import kubectl_view as view
from gpuledger_common.kubeconfig import UserAccess, for_user
from gpuledger_common.settings import SettingsError
from gpuledger_core import codec_status
from gpuledger_core.errors import GpuledgerError, InvalidArgument, NotFound, PermissionDenied, Unavailable
from gpuledger_dev.natsserver import free_port
from tests.unit.cli.test_kubectl_view import NODES

PROXY = "/api/v1/namespaces/gpuledger/services/http:gpuledger-allocator:http/proxy/api/cluster"


def kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "alice", "user": {"token": "alices-token"}}],
        "contexts": [
            {"name": "a", "context": {"cluster": "c", "user": "alice", "namespace": "team-a"}},
            {"name": "b", "context": {"cluster": "c", "user": "alice", "namespace": "team-b"}},
            {"name": "bare", "context": {"cluster": "c", "user": "alice"}},
        ],
        "current-context": "a",
    }
    path.write_text(json.dumps(config))
    return path


@dataclass
class FakeApiServer:
    """The API server's service proxy as the plugin sees it: what it answers, and what it was asked."""

    status: int = 200
    body: Any = field(default_factory=lambda: {"nodes": [codec_status.node_status_to(n) for n in NODES]})
    asked: list[web.Request] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.asked.append(request)
        return web.json_response(self.body, status=self.status)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[FakeApiServer, Path]]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/services/{name}/proxy/api/cluster", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield fake, kubeconfig(tmp_path / "config", f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


def args(*argv: str) -> Any:
    return plugin.parser().parse_args(list(argv))


async def shown(capsys: pytest.CaptureFixture[str], config: Path, *argv: str) -> str:
    assert await plugin.run(args("--kubeconfig", str(config), *argv)) == 0
    return capsys.readouterr().out


def test_defaults_are_kubectls_and_the_manifests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/one:/two")
    found = args()
    assert (found.view, found.namespace, found.all_namespaces, found.output) == ("inspect", "", False, "table")
    assert found.kubeconfig == "/one:/two"
    assert (found.gpuledger_namespace, found.gpuledger_service, found.gpuledger_port) == (
        "gpuledger",
        "gpuledger-allocator",
        "http",
    )
    monkeypatch.delenv("KUBECONFIG")
    assert args().kubeconfig == str(Path("~/.kube/config"))
    assert args("top", "-n", "x", "-o", "json").view == "top"
    assert args("-A", "top").all_namespaces


@pytest.mark.parametrize(
    ("argv", "context_namespace", "scope"),
    [
        ([], "team-a", "team-a"),  # the context's
        (["-n", "team-b"], "team-a", "team-b"),  # -n over the context's
        ([], "", "default"),  # as kubectl: a context without one means default
        (["-A"], "team-a", ""),
        (["-A", "-n", "team-b"], "team-a", ""),  # -A wins, as in kubectl get
    ],
)
def test_whose_holders_to_show(argv: list[str], context_namespace: str, scope: str) -> None:
    access = UserAccess(None, "ctx", context_namespace, "/k")
    assert plugin.scope_of(args(*argv), access) == view.Scope(scope)


def test_the_proxy_path_names_scheme_service_and_port() -> None:
    assert plugin.Allocator().proxy_path("/api/cluster") == PROXY
    assert plugin.Allocator("gl", "alloc", "8081").proxy_path("/x") == (
        "/api/v1/namespaces/gl/services/http:alloc:8081/proxy/x"
    )


@pytest.mark.parametrize("bad", [("", "s", "p"), ("n/x", "s", "p"), ("n", "S", "p"), ("n", "s", "a:b")])
def test_a_name_that_is_not_one_is_refused(bad: tuple[str, str, str]) -> None:
    with pytest.raises(InvalidArgument, match=r"^--gpuledger-(namespace|service|port): must be a Kubernetes name"):
        plugin.Allocator(*bad)


async def test_the_context_namespace_is_shown_through_the_proxy_with_the_users_token(
    api: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake, config = api
    out = await shown(capsys, config)
    assert out == view.inspect_text(NODES, view.Scope("team-a")) + "\n"
    [request] = fake.asked
    assert request.path == PROXY and not request.query
    assert request.headers["Authorization"] == "Bearer alices-token"


async def test_context_namespace_and_filters_reach_the_allocator(
    api: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake, config = api
    out = await shown(capsys, config, "--context", "b", "--node", "p4-1", "--model", "Tesla P4")
    assert "team-b/etl[app]" in out and "team-a" not in out.splitlines()[1]
    assert dict(fake.asked[0].query) == {"node": "p4-1", "model": "Tesla P4"}
    out = await shown(capsys, config, "--gpuledger-namespace", "gl", "--gpuledger-service", "alloc")
    assert fake.asked[1].path == "/api/v1/namespaces/gl/services/http:alloc:http/proxy/api/cluster"


async def test_all_namespaces_json_and_top(api: tuple[FakeApiServer, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, config = api
    assert json.loads(await shown(capsys, config, "-A", "-o", "json")) == view.inspect_json(NODES, view.Scope())
    top = await shown(capsys, config, "top", "-n", "team-b")
    assert top == view.top_text(view.top_rows(NODES, view.Scope("team-b")), view.Scope("team-b")) + "\n"
    found = json.loads(await shown(capsys, config, "top", "-o", "json"))
    assert [h["holder"] for h in found["holders"]] == ["infer", "train"]


STATUS_403 = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'services "http:gpuledger-allocator:http" is forbidden: User "alice" cannot get resource '
    '"services/proxy" in API group "" in the namespace "gpuledger"',
    "reason": "Forbidden",
    "code": 403,
}


async def test_forbidden_names_the_permission_and_the_role(api: tuple[FakeApiServer, Path]) -> None:
    fake, config = api
    fake.status, fake.body = 403, STATUS_403
    with pytest.raises(PermissionDenied) as caught:
        await plugin.run(args("--kubeconfig", str(config)))
    message = str(caught.value)
    assert message.startswith(str(STATUS_403["message"]))
    assert "needs `get` on services/proxy of the service gpuledger-allocator in the namespace gpuledger" in message
    assert "kubectl -n gpuledger create rolebinding gpuledger-viewer-<you> --role gpuledger-viewer" in message


def status(code: int, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "code": code, "message": message}).encode()


WHERE = plugin.Allocator()
ACCESS = UserAccess(None, "ctx-a", "team-a", "/k")


@pytest.mark.parametrize(
    ("code", "body", "kind", "says"),
    [
        (401, status(401, "Unauthorized"), PermissionDenied, "did not accept the credentials of context ctx-a"),
        (404, status(404, 'services "gpuledger-allocator" not found'), NotFound, "is gpuledger installed there?"),
        (503, status(503, 'no endpoints available for service "gpuledger-allocator"'), Unavailable, "Are its pods"),
        (503, status(503, "error trying to reach service: dial tcp: connection refused"), Unavailable, "refused"),
        (502, b"bad gateway", Unavailable, "cannot be reached through the API server (service gpuledger-allocator"),
        (404, b"404: Not Found", GpuledgerError, "the allocator answered HTTP 404 through the API server"),
        (500, b"", GpuledgerError, "HTTP 500 through the API server: HTTP 500"),
    ],
)
def test_each_failure_says_what_to_do(code: int, body: bytes, kind: type[Exception], says: str) -> None:
    err = plugin.proxy_error(code, body, WHERE, ACCESS)
    assert type(err) is kind
    assert says in str(err)


def test_an_answer_that_is_not_the_clusters_status_is_said() -> None:
    with pytest.raises(GpuledgerError, match=r"^the allocator's answer is not the cluster's status"):
        plugin.decode(b"<html>")
    with pytest.raises(GpuledgerError, match=r"^the allocator's answer is not the cluster's status"):
        plugin.decode(b'{"nodes": [{"cards": "x"}]}')


async def test_a_bad_kubeconfig_says_which(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"^kubeconfig: no such file: /nowhere:/nor/here$"):
        await for_user("/nowhere:/nor/here", "")
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(SettingsError, match=rf"^kubeconfig: cannot use {broken}: .*current-context"):
        await for_user(str(broken), "")
    config = kubeconfig(tmp_path / "config", "https://127.0.0.1:1")
    with pytest.raises(SettingsError, match=rf"^kubeconfig: cannot use context 'nope' of {config}: "):
        await for_user(str(config), "nope")


async def test_kubeconfig_files_merge_as_in_kubectl(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "config", "https://127.0.0.1:1")
    access = await for_user(f"{tmp_path / 'missing'}:{config}", "bare")
    assert (access.context, access.namespace, access.configuration.host) == ("bare", "", "https://127.0.0.1:1")
    assert (await for_user(str(config))).namespace == "team-a"


def test_exit_codes_and_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plugin.main(["--kubeconfig", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"kubectl gpuledger: kubeconfig: no such file: {tmp_path / 'none'}\n"
    config = kubeconfig(tmp_path / "config", f"http://127.0.0.1:{free_port()}")
    assert plugin.main(["--kubeconfig", str(config)]) == 5
    assert capsys.readouterr().err.startswith("kubectl gpuledger: Kubernetes API unreachable for the allocator's")
    assert plugin.main(["--kubeconfig", str(config), "--gpuledger-port", "HTTP"]) == 2
    assert "invalid --gpuledger-port: must be a Kubernetes name" in capsys.readouterr().err
