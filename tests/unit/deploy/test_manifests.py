"""deploy/kubernetes: every rendering is schema-valid and hangs together.

Rendering is the Python subset of kustomize in kustomize.py (compared with the real ``kubectl
kustomize`` of the control-plane build in tests/e2e/test_kustomize_parity.py). Every object is
validated against the Kubernetes OpenAPI schemas bundled in the kubernetes-validate package (strict:
unknown fields fail), for the oldest and the newest Kubernetes minor this deployment supports. Then
the cross-references: names, selectors, ports, probes, settings, NATS and the scheduler configuration.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gpuledger_cli import natsconfig
from gpuledger_common.settings import nats_servers
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.natsserver import find_binary
from gpuledger_dev.tlsca import ThrowawayCa

from .kustomize import KustomizeError, build
from .manifests import (
    CLUSTER_SCOPED,
    KUSTOMIZE,
    NAMESPACE,
    OPERATOR_SECRETS,
    PROVIDED,
    RENDERS,
    container_env,
    containers,
    generated,
    key,
    matches,
    named,
    of_kind,
    port_number,
    rendered,
    workloads,
)
from .services import DEPLOY, flags_of, program

KUBERNETES_VERSIONS = ("1.30", "1.36")  # 1.30: ValidatingAdmissionPolicy v1
SERVED = {"/healthz", "/readyz", "/metrics"}  # gpuledger_common.ops and the inventory's http.py
CENTRAL = ("gpuledger-allocator", "gpuledger-placement", "gpuledger-scheduler")


# --- rendering and schemas ---------------------------------------------------------------------


@pytest.mark.parametrize("path", RENDERS)
def test_renders_with_unique_objects(path: str) -> None:
    objects = rendered(path)
    keys = [key(o) for o in objects]
    assert len(keys) == len(set(keys))
    assert ("Namespace", None, NAMESPACE) in keys


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", RENDERS)
def test_every_object_is_valid_against_the_kubernetes_schemas(path: str, version: str) -> None:
    for obj in rendered(path):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{path}: {obj['kind']}/{obj['metadata']['name']} (Kubernetes {version}): {err.message}")


def test_the_toleration_component_is_valid_against_the_1_36_schemas() -> None:
    """components/gpu-node-toleration: MutatingAdmissionPolicy v1 is GA from 1.36."""
    path = KUSTOMIZE / "components" / "gpu-node-toleration" / "toleration.yaml"
    objects = [o for o in yaml.safe_load_all(path.read_text()) if o]
    assert {o["kind"] for o in objects} == {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    for obj in objects:
        kubernetes_validate.validate(obj, "1.36", strict=True)


def test_the_dra_objects_are_valid_against_the_1_36_schemas() -> None:
    """deploy/kubernetes/dra: the DeviceClass (resource.k8s.io/v1, 1.34+) and the claims controller's RBAC."""
    objects = [o for p in sorted((KUSTOMIZE / "dra").glob("*.yaml")) for o in yaml.safe_load_all(p.read_text()) if o]
    kinds = {o["kind"] for o in objects}
    assert {"DeviceClass", "ClusterRole", "ClusterRoleBinding"} <= kinds
    for obj in objects:
        if obj["kind"] != "Kustomization":
            kubernetes_validate.validate(obj, "1.36", strict=True)


def test_dra_nodes_get_the_dra_agents_and_only_those() -> None:
    """A node labelled gpuledger.io/mode=dra runs dra/node.yaml's DaemonSet (the DRA plugin, its
    kubelet directories, an API token) and not the base's (the device plugin)."""
    objects = [o for o in yaml.safe_load_all((KUSTOMIZE / "dra" / "node.yaml").read_text()) if o]
    dra = next(o for o in objects if o["kind"] == "DaemonSet")
    base = named(rendered("base"), "DaemonSet", "gpuledger-node")

    def terms(ds: dict[str, Any]) -> list[list[dict[str, Any]]]:
        affinity = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        return [
            t["matchExpressions"]
            for t in affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        ]

    mode = {"key": "gpuledger.io/mode", "values": ["dra"]}
    assert all({**mode, "operator": "In"} in t for t in terms(dra))
    assert all({**mode, "operator": "NotIn"} in t for t in terms(base))
    containers = {c["name"]: c for c in dra["spec"]["template"]["spec"]["containers"]}
    for name in ("inventory", "plugin"):
        assert {"name": "GPULEDGER_MODE", "value": "dra"} in containers[name]["env"]
    mounts = {m["mountPath"] for m in containers["plugin"]["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi"} <= mounts
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
    assert "/var/lib/kubelet/device-plugins" not in mounts
    assert containers["plugin"]["securityContext"] == named_container(base, "plugin")["securityContext"]


def named_container(ds: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def test_the_schema_check_rejects_a_misspelt_field() -> None:
    deployment = named(rendered("base"), "Deployment", "gpuledger-allocator")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("namePrefix: x-\n")
    with pytest.raises(KustomizeError, match="namePrefix"):
        build(tmp_path)


# --- names and references ----------------------------------------------------------------------


@pytest.mark.parametrize("path", RENDERS)
def test_everything_is_in_the_gpuledger_namespace(path: str) -> None:
    for obj in rendered(path):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert namespace is None, key(obj)
        elif key(obj) == ("RoleBinding", "kube-system", "gpuledger-scheduler-authentication-reader"):
            continue
        else:
            assert namespace == NAMESPACE, key(obj)


@pytest.mark.parametrize("path", RENDERS)
def test_every_referenced_object_exists(path: str) -> None:
    objects = rendered(path)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects} | PROVIDED
    for binding in [*of_kind(objects, "RoleBinding"), *of_kind(objects, "ClusterRoleBinding")]:
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in names
        for subject in binding["subjects"]:
            assert (subject["kind"], subject["name"]) in names
            assert subject["namespace"] == NAMESPACE
    for _, spec in workloads(objects):
        assert ("ServiceAccount", spec["serviceAccountName"]) in names
        for kind, name in _pod_references(spec):
            if kind == "Secret" and name in OPERATOR_SECRETS and path != "overlays/dev":
                continue
            assert (kind, name) in names, f"{path}: {kind} {name}"


def test_the_dev_secrets_have_the_keys_the_pods_read() -> None:
    objects = rendered("overlays/dev")
    read = 0
    for _, spec in workloads(objects):
        for volume in spec.get("volumes", []):
            if "secret" not in volume:
                continue
            name = volume["secret"]["secretName"]
            data = named(objects, "Secret", name)["data"]
            wanted = {item["key"] for item in volume["secret"].get("items", [])} or set(data)
            assert wanted <= set(data), name
            base = name.rsplit("-", 1)[0]
            if base in OPERATOR_SECRETS:
                assert wanted <= OPERATOR_SECRETS[base], name
                read += 1
    assert read >= len(OPERATOR_SECRETS)


def _pod_references(spec: dict[str, Any]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            found.append(("ConfigMap", volume["configMap"]["name"]))
        if "secret" in volume:
            found.append(("Secret", volume["secret"]["secretName"]))
        sources = volume.get("projected", {}).get("sources", [])
        found += [("ConfigMap", s["configMap"]["name"]) for s in sources if "configMap" in s]
    for container in spec["containers"]:
        for item in container.get("env", []):
            ref = item.get("valueFrom", {})
            if "secretKeyRef" in ref:
                found.append(("Secret", ref["secretKeyRef"]["name"]))
            if "configMapKeyRef" in ref:
                found.append(("ConfigMap", ref["configMapKeyRef"]["name"]))
        found += [("ConfigMap", s["configMapRef"]["name"]) for s in container.get("envFrom", [])]
    return found


# --- selectors, ports, probes ------------------------------------------------------------------


@pytest.mark.parametrize("path", RENDERS)
def test_selectors_match_their_pods(path: str) -> None:
    objects = rendered(path)
    templates = {w["metadata"]["name"]: (w, w["spec"]["template"]["metadata"]["labels"]) for w, _ in workloads(objects)}
    for workload, labels in templates.values():
        assert matches(workload["spec"]["selector"]["matchLabels"], labels)
    for service in of_kind(objects, "Service"):
        selected = [w for w, labels in templates.values() if matches(service["spec"]["selector"], labels)]
        assert len(selected) == 1, f"Service {service['metadata']['name']} selects {len(selected)} workloads"
        pod = selected[0]["spec"]["template"]["spec"]
        for port in service["spec"]["ports"]:
            assert any(_has_port(c, port["targetPort"]) for c in pod["containers"]), port
    for budget in of_kind(objects, "PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        selected = [w for w, labels in templates.values() if matches(selector, labels)]
        assert len(selected) == 1, f"PodDisruptionBudget {budget['metadata']['name']}"
        assert selected[0]["spec"].get("replicas", 1) > budget["spec"].get("minAvailable", 0)


def _has_port(container: dict[str, Any], port: int | str) -> bool:
    try:
        port_number(container, port)
    except LookupError:
        return False
    return isinstance(port, str) or any(p["containerPort"] == port for p in container.get("ports", []))


@pytest.mark.parametrize("path", RENDERS)
def test_gpuledger_probes_ask_served_paths_on_the_service_http_port(path: str) -> None:
    objects = rendered(path)
    for _, _, container in containers(objects):
        script = container.get("command", [""])[0]
        if not script.startswith("gpuledger"):
            continue
        http_port = _effective(objects, container, "http_port")
        live, ready = container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]
        assert (live["path"], ready["path"]) == ("/healthz", "/readyz")
        assert {live["path"], ready["path"]} <= SERVED
        for probe in (live, ready):
            assert port_number(container, probe["port"]) == int(str(http_port)), container["name"]


def _effective(objects: list[Any], container: dict[str, Any], field: str) -> object:
    """A setting's value in the container: env (incl. envFrom), else the program's default."""
    env = container_env(objects, container)
    name = "GPULEDGER_" + field.upper()
    if name in env:
        return env[name]
    found = program(container["command"][0])
    assert found is not None, f"{container['command'][0]}: {name} must be set while the program is pending"
    return found.defaults[field]


# --- the programs and their settings -----------------------------------------------------------


def _gpuledger_containers() -> list[tuple[str, str, str]]:
    found = []
    for path in RENDERS:
        for workload, _, container in containers(rendered(path)):
            if container.get("command", [""])[0].startswith("gpuledger"):
                found.append((path, workload["metadata"]["name"], container["name"]))
    return found


@pytest.mark.parametrize(("path", "workload", "name"), _gpuledger_containers())
def test_every_command_flag_and_variable_is_a_real_setting(path: str, workload: str, name: str) -> None:
    objects = rendered(path)
    container = next(c for w, _, c in containers(objects) if w["metadata"]["name"] == workload and c["name"] == name)
    script, *args = container["command"]
    found = program(script)
    args += container.get("args", [])
    assert set(flags_of(args)) <= found.flags
    variables = {n for n in container_env(objects, container) if n.startswith("GPULEDGER_")}
    assert variables <= found.env, f"{workload}/{name}: not settings: {variables - found.env}"
    assert {v.removeprefix("GPULEDGER_").lower() for v in variables} <= found.fields


@pytest.mark.parametrize("path", RENDERS)
def test_every_gpuledger_container_lists_every_nats_server_over_tls_with_its_own_user(path: str) -> None:
    objects = rendered(path)
    servers = named(objects, "StatefulSet", "gpuledger-nats")
    headless = named(objects, "Service", servers["spec"]["serviceName"])
    pods = {f"{servers['metadata']['name']}-{i}" for i in range(servers["spec"]["replicas"])}
    client = next(p["port"] for p in headless["spec"]["ports"] if p["name"] == "client")
    for _, _, container in containers(objects):
        if not container.get("command", [""])[0].startswith("gpuledger"):
            continue
        env = [e["name"] for e in container["env"]]
        listed = container_env(objects, container)["GPULEDGER_NATS_URL"]
        urls = [urlsplit(u) for u in nats_servers(listed)]  # as the services read it
        for url in urls:  # TLS, and no credentials in any URL
            assert (url.scheme, url.username, url.password) == ("tls", None, None)
            domain = (url.hostname or "").partition(".")[2]
            assert domain == f"{headless['metadata']['name']}.{NAMESPACE}.svc" and url.port == client
        # every server of the StatefulSet, each once: a client reconnects to any that is up
        assert sorted((u.hostname or "").split(".")[0] for u in urls) == sorted(pods), container["name"]
        settings = container_env(objects, container)
        user = settings["GPULEDGER_NATS_USER"]
        role = container["command"][0].removeprefix("gpuledger-")
        if role in ("inventory", "plugin"):  # the node's own user: Kubernetes expands $(NAME) ...
            assert user == f"{role}-$(GPULEDGER_NODE)"
            assert env.index("GPULEDGER_NODE") < env.index("GPULEDGER_NATS_USER")  # ... if it came first
        else:
            assert user == role
        assert settings["GPULEDGER_NATS_CA_FILE"].endswith("/ca.crt")
        assert _mounted_at(container, settings["GPULEDGER_NATS_PASSWORD_FILE"]), container["name"]
        assert _mounted_at(container, settings["GPULEDGER_NATS_CA_FILE"]), container["name"]


def _mounted_at(container: dict[str, Any], path: str) -> bool:
    return any(path.startswith(m["mountPath"].rstrip("/") + "/") for m in container.get("volumeMounts", []))


@pytest.mark.parametrize("path", ["base", "overlays/production"])
def test_each_central_service_mounts_only_its_own_nats_password(path: str) -> None:
    objects = rendered(path)
    for workload, spec, container in containers(objects):
        role = container.get("command", [""])[0].removeprefix("gpuledger-")
        if role not in ("allocator", "placement"):
            continue
        volume = next(v for v in spec["volumes"] if v["name"] == "nats-password")
        assert volume["secret"]["secretName"] == "gpuledger-nats-users"
        assert volume["secret"]["items"] == [{"key": role, "path": "password"}], workload["metadata"]["name"]


def test_the_node_agents_read_their_passwords_from_the_node() -> None:
    spec = named(rendered("base"), "DaemonSet", "gpuledger-node")["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "nats-password")
    assert volume["hostPath"]["path"] == "/etc/gpuledger/nats"
    assert not any("gpuledger-nats-users" in str(v) for v in spec["volumes"])  # no other node's password


@pytest.mark.parametrize("path", RENDERS)
def test_the_allocators_grpc_api_has_mutual_tls(path: str) -> None:
    objects = rendered(path)
    deployment = named(objects, "Deployment", "gpuledger-allocator")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    settings = container_env(objects, container)
    for name in ("GPULEDGER_GRPC_CERT_FILE", "GPULEDGER_GRPC_KEY_FILE", "GPULEDGER_GRPC_CLIENT_CA_FILE"):
        assert _mounted_at(container, settings[name]), name
    assert settings["GPULEDGER_GRPC_ADMINS"]


# --- the central services ----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["base", "overlays/production"])
@pytest.mark.parametrize("name", CENTRAL)
def test_central_services_are_highly_available(path: str, name: str) -> None:
    objects = rendered(path)
    deployment = named(objects, "Deployment", name)
    assert deployment["spec"]["replicas"] == 2
    assert named(objects, "PodDisruptionBudget", name)["spec"]["minAvailable"] == 1
    pod = deployment["spec"]["template"]["spec"]
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert matches(term["labelSelector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize("path", RENDERS)
def test_every_container_has_requests_and_limits(path: str) -> None:
    for workload, _, container in containers(rendered(path)):
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), workload["metadata"]["name"]
        assert {"cpu", "memory"} <= set(resources["limits"]), workload["metadata"]["name"]


def test_images_name_no_registry_and_overlays_pin_every_version() -> None:
    for path in RENDERS:
        for _, _, container in containers(rendered(path)):
            image = container["image"]
            first = image.split("/")[0]
            assert "/" not in image or not ("." in first or ":" in first or first == "localhost"), image
            if path != "base":
                assert ":" in image, f"{path}: {image} has no tag"


# --- NATS ----------------------------------------------------------------------------------------


def _nats_config(objects: list[Any]) -> str:
    text: str = generated(objects, "ConfigMap", "gpuledger-nats-config")["data"]["nats.conf"]
    return text


@pytest.mark.parametrize("path", ["base", "overlays/production"])
def test_nats_is_a_three_server_jetstream_cluster_with_storage_and_auth(path: str) -> None:
    objects = rendered(path)
    nats = named(objects, "StatefulSet", "gpuledger-nats")
    replicas = nats["spec"]["replicas"]
    assert replicas == 3
    headless = named(objects, "Service", nats["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    container = nats["spec"]["template"]["spec"]["containers"][0]
    routes = container["args"][container["args"].index("--routes") + 1].split(",")
    wanted = {f"tls://gpuledger-nats-{i}.{headless['metadata']['name']}.{NAMESPACE}.svc:6222" for i in range(replicas)}
    assert set(routes) == wanted  # TLS, no password in them
    config = _nats_config(objects)
    assert re.search(r"cluster \{[^}]*port: 6222", config)
    route_tls = re.search(r"cluster \{.*?tls \{([^}]*)\}", config, re.S)
    assert route_tls is not None and "verify: true" in route_tls.group(1)  # routes: mutual TLS
    _assert_jetstream_on_the_volume(nats, config)
    _assert_authenticated(config)
    settings = generated(objects, "ConfigMap", "gpuledger-allocator-settings")["data"]
    assert settings["GPULEDGER_BUCKET_REPLICAS"] == "3"


def test_dev_nats_is_one_server_without_routes() -> None:
    objects = rendered("overlays/dev")
    nats = named(objects, "StatefulSet", "gpuledger-nats")
    assert nats["spec"]["replicas"] == 1
    assert "--routes" not in nats["spec"]["template"]["spec"]["containers"][0]["args"]
    config = _nats_config(objects)
    assert "cluster {" not in config
    _assert_jetstream_on_the_volume(nats, config)
    _assert_authenticated(config)
    assert generated(objects, "ConfigMap", "gpuledger-allocator-settings")["data"]["GPULEDGER_BUCKET_REPLICAS"] == "1"


@pytest.mark.parametrize("path", RENDERS)
def test_nats_server_accepts_the_rendered_configuration_and_arguments(path: str, tmp_path: Path) -> None:
    """The config, with the files of its Secrets where the pod mounts them (under ``tmp_path``):
    a server certificate and the users ``gpuledger nats-config`` writes."""
    objects = rendered(path)
    container = named(objects, "StatefulSet", "gpuledger-nats")["spec"]["template"]["spec"]["containers"][0]
    env = {"SERVER_NAME": "gpuledger-nats-0"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    root = str(tmp_path)
    args = [a.replace(mounts["config"], root + mounts["config"]) for a in container["args"]]
    config = _nats_config(objects).replace(mounts["tls"], root + mounts["tls"])
    (tmp_path / mounts["config"].lstrip("/")).mkdir(parents=True)
    (tmp_path / mounts["config"].lstrip("/") / "nats.conf").write_text(config)
    auth = tmp_path / mounts["auth"].lstrip("/")
    assert natsconfig.main(["--out", str(auth), "--node", "gpu-1"]) == 0
    ca = ThrowawayCa(tmp_path / "ca")
    issued = ca.issue("gpuledger-nats", ("gpuledger-nats-0.gpuledger-nats-headless.gpuledger.svc",))
    tls = tmp_path / mounts["tls"].lstrip("/")
    tls.mkdir(parents=True)
    for name, source in (("tls.crt", issued.cert), ("tls.key", issued.key), ("ca.crt", ca.cert)):
        (tls / name).write_bytes(source.read_bytes())
    done = subprocess.run([find_binary(), "-t", *args], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr + done.stdout


def _assert_jetstream_on_the_volume(nats: dict[str, Any], config: str) -> None:
    store = re.search(r"store_dir: (\S+)", config)
    assert store is not None
    claim = nats["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    mounts = nats["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    mounted = next(m["mountPath"] for m in mounts if m["name"] == claim)
    assert store.group(1).startswith(mounted.rstrip("/") + "/")
    assert "--config" in nats["spec"]["template"]["spec"]["containers"][0]["args"]


def _assert_authenticated(config: str) -> None:
    """Clients over TLS, as the users of gpuledger nats-config (the Secret's auth.conf)."""
    tls = re.search(r"^tls \{([^}]*)\}", config, re.M)
    assert tls is not None and all(f in tls.group(1) for f in ("cert_file", "key_file", "ca_file"))
    assert re.search(r"^include \.\./auth/auth\.conf$", config, re.M)
    assert "$NATS_PASSWORD" not in config


# --- the scheduler -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", RENDERS)
def test_the_scheduler_runs_the_mounted_configuration_with_the_placement_extender(path: str) -> None:
    objects = rendered(path)
    config_map = generated(objects, "ConfigMap", "gpuledger-scheduler-config")
    deployment = named(objects, "Deployment", "gpuledger-scheduler")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    config_flag = next(a for a in container["command"] if a.startswith("--config="))
    path_in_pod = config_flag.removeprefix("--config=")
    assert path_in_pod.startswith(mount["mountPath"] + "/")
    config = yaml.safe_load(config_map["data"][path_in_pod.rsplit("/", 1)[1]])
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpuledger-scheduler"]
    (extender,) = config["extenders"]
    service = named(objects, "Service", "gpuledger-placement")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "extender")
    assert extender["urlPrefix"] == f"https://gpuledger-placement.{NAMESPACE}.svc:{port}/gpuledger"
    _assert_extender_tls(objects, pod, container, extender["tlsConfig"])
    verbs = (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"])
    assert verbs == ("filter", "prioritize", "bind")
    assert extender["nodeCacheCapable"] is True
    assert not extender.get("managedResources")
    election = config["leaderElection"]
    role = named(objects, "Role", "gpuledger-scheduler-leader-election")
    assert election["resourceNamespace"] == role["metadata"]["namespace"]
    assert any(election["resourceName"] in rule.get("resourceNames", []) for rule in role["rules"])


def _assert_extender_tls(
    objects: list[Any], scheduler_pod: dict[str, Any], scheduler: dict[str, Any], tls: dict[str, str]
) -> None:
    """kube-scheduler's tlsConfig files are its mounted client Secret; placement serves HTTPS on the
    Service's extender port with its own Secret and lets that client's common name in."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in scheduler_pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in scheduler["volumeMounts"]}
    folder = str(Path(tls["certFile"]).parent)
    assert secrets[mounts[folder]].startswith("gpuledger-scheduler-extender-tls")  # dev: a hash suffix
    assert {Path(f).name for f in tls.values()} == {"tls.crt", "tls.key", "ca.crt"}
    placement = named(objects, "Deployment", "gpuledger-placement")
    pod = placement["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    for field, file in (("cert_file", "tls.crt"), ("key_file", "tls.key"), ("client_ca_file", "ca.crt")):
        value = Path(str(_effective(objects, container, f"extender_{field}")))
        assert value.name == file and mounted[str(value.parent)].startswith("gpuledger-placement-tls"), field
    port = int(str(_effective(objects, container, "extender_port")))
    assert port_number(container, "extender") == port
    assert "gpuledger-scheduler" in str(_effective(objects, container, "extender_clients")).split(",")


# --- the node agents -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", RENDERS)
def test_the_plugin_mounts_the_kubelet_directories_it_is_configured_for(path: str) -> None:
    objects = rendered(path)
    daemonset = named(objects, "DaemonSet", "gpuledger-node")
    pod = daemonset["spec"]["template"]["spec"]
    plugin = next(c for c in pod["containers"] if c["command"] == ["gpuledger-plugin"])
    host_paths = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: m["name"] for m in plugin["volumeMounts"]}
    device_plugin_dir = str(_effective(objects, plugin, "device_plugin_dir"))
    pod_resources_dir = str(Path(str(_effective(objects, plugin, "pod_resources_socket"))).parent)
    for directory in (device_plugin_dir, pod_resources_dir):
        assert host_paths[mounts[directory]] == {"path": directory, "type": "Directory"}


@pytest.mark.parametrize("path", RENDERS)
def test_the_node_agents_run_on_gpu_nodes_and_tolerate_gpu_taints(path: str) -> None:
    pod = named(rendered(path), "DaemonSet", "gpuledger-node")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert keys == {"gpuledger.io/gpu-node", "nvidia.com/gpu.present", "gpuledger.io/mode"}
    assert {"nvidia.com/gpu", "gpuledger.io/gpu"} <= {t["key"] for t in pod["tolerations"]}


@pytest.mark.parametrize("path", RENDERS)
def test_the_inventory_keeps_its_health_book_on_the_host(path: str) -> None:
    objects = rendered(path)
    pod = named(objects, "DaemonSet", "gpuledger-node")["spec"]["template"]["spec"]
    inventory = next(c for c in pod["containers"] if c["command"] == ["gpuledger-inventory"])
    state = Path(str(_effective(objects, inventory, "state_file")))
    mount = next(m for m in inventory["volumeMounts"] if m["mountPath"] == str(state.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"


def test_dev_inventories_read_a_fleet_file_that_the_overlay_ships() -> None:
    objects = rendered("overlays/dev")
    pod = named(objects, "DaemonSet", "gpuledger-node")["spec"]["template"]["spec"]
    inventory = next(c for c in pod["containers"] if c["command"] == ["gpuledger-inventory"])
    fleet_path = Path(str(_effective(objects, inventory, "fake_fleet")))
    mount = next(m for m in inventory["volumeMounts"] if m["mountPath"] == str(fleet_path.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    data = named(objects, "ConfigMap", volume["configMap"]["name"])["data"]
    assert fleet_path.name in data
    fleet = load_fleet(str(KUSTOMIZE / "overlays" / "dev" / fleet_path.name))
    assert len(fleet.nodes) >= 1


def test_compose_and_the_dockerfile_name_no_registry_host() -> None:
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    images = [s["image"] for s in compose["services"].values()]
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    images += re.findall(r"^ARG PYTHON_IMAGE=(\S+)", dockerfile, re.MULTILINE)
    assert len(images) > len(compose["services"])
    for image in images:
        first = image.split("/")[0]
        assert "/" not in image or not ("." in first or ":" in first), image
