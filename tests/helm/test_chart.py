"""The Helm chart (deploy/helm/gpuledger) through the real helm: ``helm lint``, ``helm template`` with
several sets of values, every object valid against the Kubernetes schemas, and the objects equal,
field by field, to what kustomize renders from deploy/kubernetes for the same values.

``tox -e helm`` builds helm first (``python -m tests.support.helm``); without it these tests fail,
naming that command."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuledger_common.natsauth import authorization_conf, users_for
from tests.support.chart import CHART, KUSTOMIZE
from tests.unit.deploy.kustomize import Obj

from .chart import (
    NAMESPACE,
    PRODUCTION,
    assert_same_objects,
    key,
    kustomize,
    run_helm,
    template,
    template_fails,
    values_file,
)

DRA_POOLS: dict[str, Any] = {"nodePools": [{"name": "node", "mode": "classic"}, {"name": "node-dra", "mode": "dra"}]}
ONE_EACH: dict[str, Any] = {
    "nats": {"replicas": 1},
    "allocator": {"replicas": 1},
    "placement": {"replicas": 1},
    "scheduler": {"replicas": 1},
}
EXISTING: dict[str, Any] = {
    "credentials": {
        "secrets": {
            "natsAuth": "ours-nats-auth",
            "natsUsers": "ours-nats-users",
            "natsTls": "ours-nats-tls",
            "allocatorTls": "ours-allocator-tls",
            "placementTls": "ours-placement-tls",
            "schedulerExtenderTls": "ours-extender-tls",
        }
    }
}
NODES = ["gpu-1", "gpu-2.rack-a"]
GENERATE: dict[str, Any] = {"credentials": {"generate": True, "nodes": NODES}}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "dra-pools": DRA_POOLS,
    "one-each": ONE_EACH,
    "existing-secrets": EXISTING,
    "generated": GENERATE,
    "everything": {
        **DRA_POOLS,
        **GENERATE,
        "nats": {"replicas": 5},
        "allocator": {"replicas": 3},
        "guard": {"tolerationPolicy": True},
        "namespace": {"create": True},
        "central": {"nodeSelector": {"pool": "system"}, "tolerations": [{"key": "system", "operator": "Exists"}]},
        "imagePullSecrets": [{"name": "registry"}],
        "image": {"pullPolicy": "Always"},
    },
}
DRA_KINDS = {"DeviceClass", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


def objects_named(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_spec(objects: list[Obj], kind: str, name: str) -> Obj:
    spec: Obj = objects_named(objects, kind)[name]["spec"]["template"]["spec"]
    return spec


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


# --- lint and schemas ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_passes_strictly(name: str, tmp_path: Path) -> None:
    path = values_file(tmp_path, VALUE_SETS[name])
    done = run_helm("lint", "--strict", str(CHART), "-n", NAMESPACE, "-f", str(path))
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout, done.stdout


def test_helm_lint_catches_a_broken_template(tmp_path: Path) -> None:
    broken = tmp_path / "gpuledger"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("kind: ConfigMap\nmetadata:\n  name: {{ .Values.nope.deeper }}\n")
    assert run_helm("lint", str(broken), "-n", NAMESPACE, check=False).returncode != 0


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
@pytest.mark.parametrize("version", ["1.30", "1.36"])
def test_every_rendered_object_is_valid_against_the_kubernetes_schemas(name: str, version: str, tmp_path: Path) -> None:
    objects = template(tmp_path, VALUE_SETS[name])
    assert objects
    for obj in objects:
        if version == "1.30" and (obj["kind"] in DRA_KINDS or obj["apiVersion"].startswith("resource.k8s.io/")):
            continue  # DRA's API (1.34) and MutatingAdmissionPolicy v1 (1.36) are newer than 1.30
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{name}: {key(obj)} is not valid for Kubernetes {version}: {err.message}")


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_object_is_in_the_namespace_or_cluster_wide_and_unique(name: str, tmp_path: Path) -> None:
    objects = template(tmp_path, VALUE_SETS[name])
    keys = [key(o) for o in objects]
    assert len(keys) == len(set(keys))
    elsewhere = {("RoleBinding", "kube-system", "gpuledger-scheduler-authentication-reader")}  # reads kube-system's
    for obj in objects:
        assert obj["metadata"].get("namespace") in (None, NAMESPACE) or key(obj) in elsewhere, key(obj)


# --- the same objects as kustomize -------------------------------------------------------------


def test_the_defaults_render_the_production_overlay(tmp_path: Path) -> None:
    chart = template(tmp_path, {"namespace": {"create": True}})
    assert_same_objects(chart, kustomize(PRODUCTION), "defaults against overlays/production")


def test_dra_pools_render_the_base_with_the_dra_directory(tmp_path: Path) -> None:
    root = os.path.relpath(KUSTOMIZE, tmp_path)
    images = (PRODUCTION / "kustomization.yaml").read_text().split("images:", 1)[1]
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {root}/base\n  - {root}/dra\nimages:{images}"
    )
    chart = template(tmp_path, {**DRA_POOLS, "namespace": {"create": True}})
    assert_same_objects(chart, kustomize(tmp_path), "a classic and a DRA pool against base + dra")


def test_the_toleration_policy_is_the_component(tmp_path: Path) -> None:
    chart = template(tmp_path, {"guard": {"tolerationPolicy": True}})
    component = KUSTOMIZE / "components" / "gpu-node-toleration" / "toleration.yaml"
    theirs = [o for o in yaml.safe_load_all(component.read_text()) if o]
    ours = [o for o in chart if o["kind"].startswith("MutatingAdmissionPolicy")]
    assert_same_objects(ours, theirs, "the toleration policy")
    assert not [o for o in template(tmp_path) if o["kind"].startswith("MutatingAdmissionPolicy")]


def test_one_of_each_renders_what_the_dev_overlay_runs(tmp_path: Path) -> None:
    """One NATS server (no routes, one server listed, buckets of one replica) and no
    PodDisruptionBudget of the central services, as overlays/dev."""
    chart = template(tmp_path, ONE_EACH)
    dev = kustomize(KUSTOMIZE / "overlays" / "dev")
    nats = pod_spec(chart, "StatefulSet", "gpuledger-nats")["containers"][0]
    assert nats["args"] == pod_spec(dev, "StatefulSet", "gpuledger-nats")["containers"][0]["args"]
    for kind, name in (("Deployment", "gpuledger-allocator"), ("Deployment", "gpuledger-placement")):
        ours, theirs = pod_spec(chart, kind, name)["containers"][0], pod_spec(dev, kind, name)["containers"][0]
        assert env_of(ours)["GPULEDGER_NATS_URL"] == env_of(theirs)["GPULEDGER_NATS_URL"]
    assert set(objects_named(chart, "PodDisruptionBudget")) == set(objects_named(dev, "PodDisruptionBudget"))
    assert objects_named(chart, "ConfigMap")["gpuledger-allocator-settings"]["data"]["GPULEDGER_BUCKET_REPLICAS"] == "1"
    for kind in ("StatefulSet", "Deployment"):
        assert all(o["spec"]["replicas"] == 1 for o in objects_named(chart, kind).values())


def test_the_committed_templates_are_what_the_generator_writes() -> None:
    from tests.support.chart import main

    assert main(["--check"]) == 0, "run python -m tests.support.chart"


# --- values --------------------------------------------------------------------------------------


def test_five_nats_servers_are_listed_everywhere(tmp_path: Path) -> None:
    chart = template(tmp_path, {"nats": {"replicas": 5}})
    servers = [f"gpuledger-nats-{i}.gpuledger-nats-headless.gpuledger.svc" for i in range(5)]
    args = pod_spec(chart, "StatefulSet", "gpuledger-nats")["containers"][0]["args"]
    assert args[-1] == ",".join(f"tls://{s}:6222" for s in servers)
    urls = ",".join(f"tls://{s}:4222" for s in servers)
    for kind, workload in (("Deployment", "gpuledger-allocator"), ("DaemonSet", "gpuledger-node")):
        for container in pod_spec(chart, kind, workload)["containers"]:
            assert env_of(container)["GPULEDGER_NATS_URL"] == urls
    assert objects_named(chart, "ConfigMap")["gpuledger-allocator-settings"]["data"]["GPULEDGER_BUCKET_REPLICAS"] == "3"


def test_images_pull_policy_and_secrets(tmp_path: Path) -> None:
    chart = template(
        tmp_path,
        {
            "image": {"repository": "mirror/gpuledger", "tag": "1.2.3", "pullPolicy": "Always"},
            "scheduler": {"image": {"tag": "v1.36.3"}},
            "imagePullSecrets": [{"name": "pull"}],
        },
    )
    node = pod_spec(chart, "DaemonSet", "gpuledger-node")
    assert {c["image"] for c in node["containers"]} == {"mirror/gpuledger:1.2.3"}
    assert {c["imagePullPolicy"] for c in node["containers"]} == {"Always"}
    assert node["imagePullSecrets"] == [{"name": "pull"}]
    scheduler = pod_spec(chart, "Deployment", "gpuledger-scheduler")["containers"][0]
    assert scheduler["image"] == "kube-scheduler:v1.36.3" and "imagePullPolicy" not in scheduler
    defaults = pod_spec(template(tmp_path), "Deployment", "gpuledger-allocator")["containers"][0]
    assert defaults["image"] == "gpuledger:0.1.0"


def test_node_pools_get_a_daemonset_each_of_their_mode_and_selection(tmp_path: Path) -> None:
    pools: list[dict[str, Any]] = [
        {"name": "a100", "mode": "classic", "nodeSelector": {"pool": "a100"}},
        {"name": "h100", "mode": "dra", "nodeSelector": {"pool": "h100"}, "tolerations": [{"operator": "Exists"}]},
        {
            "name": "l4",
            "mode": "dra",
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["l4"]}]}],
        },
    ]
    chart = template(tmp_path, {"nodePools": pools})
    daemonsets = objects_named(chart, "DaemonSet")
    assert set(daemonsets) == {"gpuledger-a100", "gpuledger-h100", "gpuledger-l4"}
    for name, ds in daemonsets.items():
        assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": name}
        assert ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == name
    modes = {n: env_of(pod_spec(chart, "DaemonSet", n)["containers"][0]).get("GPULEDGER_MODE") for n in daemonsets}
    assert modes == {"gpuledger-a100": None, "gpuledger-h100": "dra", "gpuledger-l4": "dra"}
    assert pod_spec(chart, "DaemonSet", "gpuledger-a100")["nodeSelector"] == {"pool": "a100"}
    assert pod_spec(chart, "DaemonSet", "gpuledger-h100")["tolerations"] == [{"operator": "Exists"}]
    l4 = pod_spec(chart, "DaemonSet", "gpuledger-l4")["affinity"]["nodeAffinity"]
    assert l4["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == pools[2]["nodeSelectorTerms"]
    assert "gpu.gpuledger.io" in objects_named(chart, "DeviceClass")
    classic_only = template(tmp_path, {"nodePools": pools[:1]})
    assert not objects_named(classic_only, "DeviceClass") and "gpuledger-dra-plugin" not in objects_named(
        classic_only, "ClusterRole"
    )


def test_central_services_placement_resources_and_replicas(tmp_path: Path) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "role", "operator": "In", "values": ["system"]}]}]}}}  # fmt: skip
    chart = template(
        tmp_path,
        {
            "central": {"nodeSelector": {"role": "system"}, "tolerations": [{"key": "system", "operator": "Exists"}]},
            "placement": {"replicas": 4, "affinity": affinity, "nodeSelector": {"zone": "a"}},
            "nats": {"resources": {"requests": {"cpu": "1", "memory": "2Gi"}}, "storage": {"storageClassName": "fast"}},
        },
    )
    for kind, name in (("StatefulSet", "gpuledger-nats"), ("Deployment", "gpuledger-allocator")):
        spec = pod_spec(chart, kind, name)
        assert spec["nodeSelector"] == {"role": "system"}
        assert spec["tolerations"] == [{"key": "system", "operator": "Exists"}]
    placement = pod_spec(chart, "Deployment", "gpuledger-placement")
    assert placement["nodeSelector"] == {"role": "system", "zone": "a"} and placement["affinity"] == affinity
    assert objects_named(chart, "Deployment")["gpuledger-placement"]["spec"]["replicas"] == 4
    nats = objects_named(chart, "StatefulSet")["gpuledger-nats"]["spec"]
    resources = nats["template"]["spec"]["containers"][0]["resources"]  # Helm merges values into the defaults
    assert resources == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert nats["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"
    assert "nodeSelector" not in pod_spec(chart, "DaemonSet", "gpuledger-node")


def test_the_scheduler_name_is_used_wherever_it_is_read(tmp_path: Path) -> None:
    chart = template(tmp_path, {"scheduler": {"name": "gpu-sched"}, "guard": {"tolerationPolicy": True}})
    config = yaml.safe_load(
        objects_named(chart, "ConfigMap")["gpuledger-scheduler-config"]["data"]["scheduler-config.yaml"]
    )
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpu-sched"]
    settings = objects_named(chart, "ConfigMap")
    assert settings["gpuledger-placement-settings"]["data"]["GPULEDGER_SCHEDULER_NAMES"] == "gpu-sched"
    selector = settings["gpuledger-allocator-settings"]["data"]["GPULEDGER_RECONCILE_FIELD_SELECTOR"]
    assert selector == "spec.schedulerName=gpu-sched"
    guard = objects_named(chart, "ValidatingAdmissionPolicy")["gpuledger-gpu-nodes-through-gpuledger"]
    assert "'gpu-sched'" in guard["spec"]["validations"][0]["expression"]
    toleration = objects_named(chart, "MutatingAdmissionPolicy")["gpuledger-gpu-node-toleration"]
    assert "'gpu-sched'" in toleration["spec"]["matchConditions"][0]["expression"]
    assert "gpuledger-scheduler'" not in yaml.safe_dump_all(chart)


def test_the_guard(tmp_path: Path) -> None:
    def guard(values: dict[str, Any]) -> tuple[str, bool]:
        chart = template(tmp_path, {"guard": values})
        setting = objects_named(chart, "ConfigMap")["gpuledger-placement-settings"]["data"]["GPULEDGER_GUARD"]
        return setting, "gpuledger-gpu-nodes-through-gpuledger" in objects_named(chart, "ValidatingAdmissionPolicy")

    assert guard({}) == ("4:32", True)
    assert guard({"cpuPerCard": 8, "memoryPerCardGiB": 64.5}) == ("8:64.5", True)
    assert guard({"enabled": False, "admissionPolicy": False}) == ("off", False)


def test_settings_are_merged_over_the_charts(tmp_path: Path) -> None:
    chart = template(tmp_path, {"settings": {"allocator": {"GPULEDGER_LOG_FORMAT": "text", "GPULEDGER_LEASE_S": 90}}})
    data = objects_named(chart, "ConfigMap")["gpuledger-allocator-settings"]["data"]
    assert data["GPULEDGER_LOG_FORMAT"] == "text" and data["GPULEDGER_LEASE_S"] == "90"
    assert data["GPULEDGER_GRPC_PORT"] == "50051"
    before = objects_named(template(tmp_path), "Deployment")["gpuledger-allocator"]["spec"]["template"]["metadata"]
    after = objects_named(chart, "Deployment")["gpuledger-allocator"]["spec"]["template"]["metadata"]
    assert before["annotations"] != after["annotations"], "a changed setting must roll the pods"


# --- credentials ---------------------------------------------------------------------------------


def test_existing_secrets_are_mounted_by_their_names_and_none_is_made(tmp_path: Path) -> None:
    chart = template(tmp_path, EXISTING)
    assert not objects_named(chart, "Secret")
    mounted = {
        v["secret"]["secretName"]
        for o in chart
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
        for v in o["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v
    }
    assert mounted == set(EXISTING["credentials"]["secrets"].values())


def secret_data(objects: list[Obj], name: str) -> dict[str, str]:
    data = objects_named(objects, "Secret")[name]["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def test_generated_nats_credentials_are_what_nats_config_writes(tmp_path: Path) -> None:
    chart = template(tmp_path, GENERATE)
    passwords = secret_data(chart, "gpuledger-nats-passwords")
    nodes = NODES
    assert set(passwords) == {"allocator", "placement", "reader", "operator"} | {
        f"{role}-{node}" for node in nodes for role in ("inventory", "plugin")
    }
    assert len(set(passwords.values())) == len(passwords) and all(len(p) >= 40 for p in passwords.values())
    assert secret_data(chart, "gpuledger-nats-users") == {k: passwords[k] for k in ("allocator", "placement")}
    conf = secret_data(chart, "gpuledger-nats-auth")["auth.conf"]
    assert conf == authorization_conf(users_for(nodes, passwords))


def _cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def test_generated_certificates_chain_name_the_services_and_keep_the_cas_apart(tmp_path: Path) -> None:
    chart = template(tmp_path, GENERATE)
    tls = {
        n: secret_data(chart, n) for n, o in objects_named(chart, "Secret").items() if o["type"] == "kubernetes.io/tls"
    }
    assert set(tls) == {
        "gpuledger-nats-tls",
        "gpuledger-allocator-tls",
        "gpuledger-admin-tls",
        "gpuledger-placement-tls",
        "gpuledger-scheduler-extender-tls",
    }
    for name, data in tls.items():
        cert, ca = _cert(data["tls.crt"]), _cert(data["ca.crt"])
        cert.verify_directly_issued_by(ca)
        assert set(data) == {"tls.crt", "tls.key", "ca.crt"}, name
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert ExtendedKeyUsageOID.CLIENT_AUTH in usages, name
    nats = _cert(tls["gpuledger-nats-tls"]["tls.crt"]).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "*.gpuledger-nats-headless.gpuledger.svc" in nats.value.get_values_for_type(x509.DNSName)
    extender = _cert(tls["gpuledger-placement-tls"]["tls.crt"]).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert "gpuledger-placement.gpuledger.svc" in extender.value.get_values_for_type(x509.DNSName)
    client = _cert(tls["gpuledger-scheduler-extender-tls"]["tls.crt"])
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpuledger-scheduler"
    admin = _cert(tls["gpuledger-admin-tls"]["tls.crt"])
    assert admin.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpuledger-admin"
    cas = {tls[n]["ca.crt"] for n in ("gpuledger-nats-tls", "gpuledger-allocator-tls", "gpuledger-placement-tls")}
    assert len(cas) == 3, "NATS, the gRPC API and the extender must not share a CA"
    assert tls["gpuledger-admin-tls"]["ca.crt"] == tls["gpuledger-allocator-tls"]["ca.crt"]
    assert tls["gpuledger-scheduler-extender-tls"]["ca.crt"] == tls["gpuledger-placement-tls"]["ca.crt"]


# --- refused values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nats": {"replicas": 2}}, "nats.replicas must be odd"),
        ({"allocator": {"replicas": 0}}, "allocator.replicas must be 1 or more"),
        ({"scheduler": {"name": "Gpu Sched'"}}, "scheduler.name must be a DNS label"),
        ({"nodePools": [{"name": "a", "mode": "mig"}]}, "mode must be classic or dra"),
        ({"nodePools": [{"name": "a", "mode": "dra"}, {"name": "a", "mode": "classic"}]}, 'name "a" twice'),
        ({"nodePools": []}, "at least one pool"),
        ({"guard": {"cpuPerCard": "four"}}, "must be numbers"),
        ({"credentials": {"generate": True, "nodes": ["gpu-*"]}}, "not a Kubernetes node name"),
    ],
)
def test_bad_values_are_refused_naming_the_value(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    assert message in template_fails(tmp_path, values)


def test_another_namespace_is_refused(tmp_path: Path) -> None:
    assert "installs into the namespace gpuledger only" in template_fails(tmp_path, {}, namespace="default")
