"""deploy/compose/compose.yaml as data: its structure, and that every command and setting it names is real.

The services and what they depend on, the image built from deploy/Dockerfile, volumes, ports,
health checks, and every program, flag and GPULEDGER_* variable against the programs themselves
(tests/unit/deploy/services.py) and the manifests' settings. tests/compose runs the stack for real.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.natsserver import find_binary

from .services import DEPLOY, ROOT, flags_of, program

COMPOSE = DEPLOY / "compose" / "compose.yaml"
FLEET = ROOT / "libs" / "gpuledger_dev" / "fleets" / "dev.yaml"
OURS = {"allocator", "placement"}  # plus one inventory per fleet node


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def all_services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def services() -> dict[str, dict[str, Any]]:
    """The services ``up`` starts (not those of a profile, such as the CLI)."""
    return {name: s for name, s in all_services().items() if not s.get("profiles")}


def gpuledger_services() -> dict[str, dict[str, Any]]:
    """The long-running services of ours (not NATS, not the one-shot credentials)."""
    return {name: s for name, s in services().items() if name not in ("nats", "credentials")}


def running_services() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services().items() if name != "credentials"}


def test_the_stack_is_nats_allocator_placement_and_an_inventory_per_fleet_node() -> None:
    nodes = [n.node.name for n in load_fleet(str(FLEET)).nodes]
    assert set(services()) == {"credentials", "nats", *OURS, *(f"inventory-{n}" for n in nodes)}


def test_the_credentials_are_written_once_for_every_fleet_node_and_given_to_each_consumer() -> None:
    creds = services()["credentials"]
    script, command, *args = creds["command"]
    assert (script, command) == ("gpuledger", "local-credentials")
    assert (_flag_value(args, "--out"), _flag_value(args, "--consumers")) == ("/credentials/all", "/credentials")
    assert _flag_value(args, "--owner") == "10001:10001"  # the user the image's services run as
    nodes = {n.node.name for n in load_fleet(str(FLEET)).nodes}
    assert {args[i + 1] for i, a in enumerate(args) if a == "--node"} == nodes
    assert creds["restart"] == "no" and creds["user"] == "0:0"  # root, to hand each new volume on
    consumers = {*running_services(), "admin"}
    assert creds["volumes"] == [
        "credentials:/credentials/all",
        *(f"credentials-{name}:/credentials/{name}" for name in sorted(consumers, key=_consumer_order)),
    ]
    assert set(compose()["volumes"]) == {"nats-data", "credentials", *(f"credentials-{c}" for c in consumers)}
    assert services()["nats"]["depends_on"]["credentials"] == {"condition": "service_completed_successfully"}


@pytest.mark.parametrize("name", sorted(running_services()))
def test_every_service_mounts_only_its_own_credentials_read_only(name: str) -> None:
    mounted = [v for v in services()[name]["volumes"] if v.startswith("credentials")]
    where = "/etc/nats/credentials" if name == "nats" else "/credentials"
    assert mounted == [f"credentials-{name}:{where}:ro"]


def test_the_cli_runs_on_demand_as_the_admin_with_the_admins_credentials_alone() -> None:
    cli = all_services()["cli"]
    assert cli["profiles"] == ["tools"] and cli["restart"] == "no"  # run --rm, never started by up
    assert cli["volumes"] == ["credentials-admin:/credentials:ro"]
    env = cli["environment"]
    assert (env["GPULEDGER_GRPC_CERT_FILE"], env["GPULEDGER_GRPC_KEY_FILE"]) == (
        "/credentials/admin.crt",
        "/credentials/admin.key",
    )
    assert env["GPULEDGER_GRPC_CA_FILE"] == "/credentials/ca.crt"
    assert cli["image"] == services()["allocator"]["image"]


def _consumer_order(name: str) -> int:
    """The order the credentials service lists the consumers' volumes in."""
    order = ["nats", "allocator", "placement", *(f"inventory-{n.node.name}" for n in load_fleet(str(FLEET)).nodes)]
    return order.index(name) if name in order else len(order)


@pytest.mark.parametrize("name", sorted(gpuledger_services()))
def test_every_service_speaks_tls_to_nats_as_its_own_user(name: str) -> None:
    service = services()[name]
    assert _setting(service, "nats_url") == "tls://nats:4222"
    assert _setting(service, "nats_ca_file") == "/credentials/ca.crt"
    script = service["command"][0].removeprefix("gpuledger-")
    user = f"{script}-{_setting(service, 'node')}" if script == "inventory" else script
    assert _setting(service, "nats_user") == user
    assert _setting(service, "nats_password_file") == "/credentials/nats-password"  # its own volume's


def test_the_grpc_api_and_the_extender_take_mutual_tls_only() -> None:
    allocator, placement = services()["allocator"], services()["placement"]
    assert _setting(allocator, "grpc_cert_file") == "/credentials/allocator.crt"
    assert _setting(allocator, "grpc_client_ca_file") == "/credentials/ca.crt"
    assert _setting(allocator, "grpc_admins") == "gpuledger-admin"
    assert _setting(placement, "extender_cert_file") == "/credentials/placement.crt"
    assert _setting(placement, "extender_client_ca_file") == "/credentials/ca.crt"


def test_nats_takes_the_mounted_configuration_with_tls_and_the_users() -> None:
    nats = services()["nats"]
    config = _flag_value(nats["command"], "-c")
    source, _ = _bind_mount(nats, config or "")
    text = source.read_text()
    assert "tls {" in text and "include ../credentials/auth.conf" in text


def test_nats_runs_jetstream_on_a_named_volume() -> None:
    nats = services()["nats"]
    assert nats["image"].startswith("nats:")
    assert "--jetstream" in nats["command"] or "-js" in nats["command"]
    store = nats["command"][nats["command"].index("--store_dir") + 1]
    volume, _, mounted = nats["volumes"][0].partition(":")
    assert mounted == store
    assert volume in compose()["volumes"]


def test_nats_flags_are_nats_server_flags() -> None:
    usage = subprocess.run([find_binary(), "--help"], capture_output=True, text=True, timeout=30)
    known = set(re.findall(r"(?<![\w-])--?[a-z_]+", usage.stdout + usage.stderr))
    flags = [a for a in services()["nats"]["command"] if a.startswith("-")]
    assert flags and set(flags) <= known


@pytest.mark.parametrize("name", sorted(gpuledger_services()))
def test_every_gpuledger_service_is_the_one_image_built_from_the_dockerfile(name: str) -> None:
    service = services()[name]
    build = service["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    assert build["target"] == "dev"  # the simulated fleet is not in the production image
    assert service["image"] == services()["allocator"]["image"]


@pytest.mark.parametrize("name", sorted(gpuledger_services()))
def test_every_gpuledger_service_waits_for_a_healthy_nats(name: str) -> None:
    assert services()[name]["depends_on"]["nats"] == {"condition": "service_healthy"}


@pytest.mark.parametrize("name", sorted(running_services()))
def test_every_service_has_a_health_check_and_restarts(name: str) -> None:
    service = services()[name]
    assert service["healthcheck"]["test"][0] == "CMD"
    assert service["restart"] == "unless-stopped"


@pytest.mark.parametrize("name", sorted(gpuledger_services()))
def test_health_checks_ask_the_service_port(name: str) -> None:
    service = services()[name]
    check = " ".join(service["healthcheck"]["test"])
    port = _setting(service, "http_port") or program(service["command"][0]).defaults["http_port"]
    assert f"http://127.0.0.1:{port}/healthz" in check or f"http://127.0.0.1:{port}/readyz" in check


def test_the_dashboard_and_grpc_are_published_on_loopback() -> None:
    allocator = services()["allocator"]
    ports = [_defaults(p) for p in allocator["ports"]]
    assert "127.0.0.1:8081:8081" in ports
    assert "127.0.0.1:50051:50051" in ports
    assert _setting(allocator, "http_port") == "8081"
    assert _setting(allocator, "grpc_port") == "50051"
    published = [p for s in services().values() for p in s.get("ports", [])]
    assert all(p.startswith("127.0.0.1:") for p in published)


@pytest.mark.parametrize("name", sorted(gpuledger_services()))
def test_settings_have_the_names_and_values_of_the_manifests(name: str) -> None:
    service = services()[name]
    manifest = _manifest_settings(service["command"][0].removeprefix("gpuledger-"))
    env = service["environment"]
    # Files are mounted where each platform mounts its Secrets or volumes: their paths differ.
    shared = {k for k in set(env) & set(manifest) if not k.endswith("_FILE")}
    shared -= {"GPULEDGER_KUBE", "GPULEDGER_LOG_FORMAT", "GPULEDGER_BUCKET_REPLICAS"}
    assert {"GPULEDGER_HTTP_PORT", "GPULEDGER_LOG_LEVEL"} <= shared
    assert {k: str(env[k]) for k in shared} == {k: manifest[k] for k in shared}
    assert env["GPULEDGER_KUBE"] == "off"  # no cluster in compose
    assert not any(a.startswith("-") for a in service["command"])  # settings by variable, as in the manifests


def test_inventories_run_on_the_mounted_fleet_each_as_its_own_node() -> None:
    nodes = {n.node.name for n in load_fleet(str(FLEET)).nodes}
    for name, service in services().items():
        if not name.startswith("inventory-"):
            continue
        assert _setting(service, "node") == name.removeprefix("inventory-")
        assert _setting(service, "node") in nodes
        assert _setting(service, "kube") == "off"
        source, _ = _bind_mount(service, _setting(service, "fake_fleet") or "")
        assert source == FLEET
        assert service["depends_on"]["allocator"] == {"condition": "service_healthy"}


@pytest.mark.parametrize("name", sorted(gpuledger_services()))
def test_every_command_is_a_console_script_and_every_flag_and_variable_is_a_setting(name: str) -> None:
    service = services()[name]
    script, *args = service["command"]
    found = program(script)
    assert set(flags_of(args)) <= found.flags, f"{name}: unknown flags {set(flags_of(args)) - found.flags}"
    for flag in flags_of(args):
        assert flag.removeprefix("--").replace("-", "_") in found.fields or flag == "--nats"
    env = set(service.get("environment", {}))
    assert env <= found.env, f"{name}: unknown variables {env - found.env}"


def test_the_plugin_is_left_out_and_the_file_says_why() -> None:
    assert not any(s["command"][0] == "gpuledger-plugin" for s in gpuledger_services().values())
    assert "No plugin shim here" in COMPOSE.read_text()


def _flag_value(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def _setting(service: dict[str, Any], field: str) -> str | None:
    """A setting as the program reads it: its flag, else its GPULEDGER_* variable."""
    flag = _flag_value(service["command"], "--" + field.replace("_", "-"))
    value = service.get("environment", {}).get("GPULEDGER_" + field.upper())
    return flag or (None if value is None else str(value))


def _defaults(text: str) -> str:
    """``${NAME:-default}`` as compose reads it when NAME is not set."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def _manifest_settings(service: str) -> dict[str, str]:
    base = yaml.safe_load((DEPLOY / "kubernetes" / "base" / "kustomization.yaml").read_text())
    for generator in base["configMapGenerator"]:
        if generator["name"] == f"gpuledger-{service}-settings":
            return dict(literal.split("=", 1) for literal in generator["literals"])
    raise AssertionError(f"the manifests have no settings for {service}")


def _bind_mount(service: dict[str, Any], target: str) -> tuple[Path, str]:
    for volume in service["volumes"]:
        source, mounted, *_ = volume.split(":")
        if mounted == target:
            return (COMPOSE.parent / source).resolve(), mounted
    raise AssertionError(f"nothing is mounted at {target}")


def test_a_real_nats_server_takes_the_configuration_with_the_written_credentials(tmp_path: Path) -> None:
    """The layout of the nats container: the configuration beside NATS's own credentials volume."""
    root = tmp_path / "etc" / "nats"
    (root / "config").mkdir(parents=True)
    config = root / "config" / "nats.conf"
    config.write_text((COMPOSE.parent / "nats.conf").read_text().replace("/etc/nats/", f"{root}/"))
    args = services()["credentials"]["command"][1:]  # local-credentials --out ... --consumers ...
    paths = {"--out": str(tmp_path / "all"), "--consumers": str(tmp_path), "--owner": f"{os.getuid()}:{os.getgid()}"}
    args = [paths.get(args[i - 1], a) if i else a for i, a in enumerate(args)]
    done = subprocess.run(
        [str(Path(sys.executable).parent / "gpuledger"), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (root / "credentials").symlink_to(tmp_path / "nats")  # credentials-nats, where the container mounts it
    checked = subprocess.run([find_binary(), "-t", "-c", str(config)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_offline_file_builds_every_image_the_stack_builds_from_the_local_base() -> None:
    """A service built from the Dockerfile but missing from offline.yaml would pull the registry's
    base image, which a machine without a registry cannot reach."""
    offline: dict[str, Any] = yaml.load((COMPOSE.parent / "offline.yaml").read_text(), _ComposeLoader)
    built = {name for name, s in all_services().items() if "build" in s}
    assert built and built <= {name for name, s in offline["services"].items() if "build" in s}


class _ComposeLoader(yaml.SafeLoader):
    """YAML with compose's merge tags (``!override``, ``!reset``) read as the values they tag."""


def _tagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> object:
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_ComposeLoader.add_multi_constructor("!", _tagged)
