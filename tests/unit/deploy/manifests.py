"""The rendered Kubernetes manifests, and lookups over them, for the manifest tests."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from .kustomize import Obj, build, pod_specs
from .services import DEPLOY

KUSTOMIZE = DEPLOY / "kubernetes"
RENDERS = ("base", "overlays/dev", "overlays/production")
NAMESPACE = "gpuledger"
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
# Objects the cluster itself provides, which the manifests may name without defining.
PROVIDED = {
    ("ConfigMap", "kube-root-ca.crt"),
    ("ClusterRole", "system:kube-scheduler"),
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}
# Created by the operator before the first apply (docs/operator-guide.md), except in dev.
# Each with the keys the pods read (docs/security.md): NATS's users and permissions (written by
# gpuledger nats-config), the central services' passwords, NATS's and the gRPC API's certificates,
# the extender's server certificate and kube-scheduler's client certificate for it.
OPERATOR_SECRETS = {
    "gpuledger-nats-auth": {"auth.conf"},
    "gpuledger-nats-users": {"allocator", "placement"},
    "gpuledger-nats-tls": {"tls.crt", "tls.key", "ca.crt"},
    "gpuledger-allocator-tls": {"tls.crt", "tls.key", "ca.crt"},
    "gpuledger-placement-tls": {"tls.crt", "tls.key", "ca.crt"},
    "gpuledger-scheduler-extender-tls": {"tls.crt", "tls.key", "ca.crt"},
}


@functools.cache
def _rendered(path: str) -> tuple[Obj, ...]:
    return tuple(build(KUSTOMIZE / path))


def rendered(path: str) -> list[Obj]:
    import copy

    return copy.deepcopy(list(_rendered(path)))


def key(obj: Obj) -> tuple[str, str | None, str]:
    return obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise LookupError(f"no {kind} {name}")


def generated(objects: list[Obj], kind: str, name: str) -> Obj:
    """A generated ConfigMap or Secret by its name before the hash suffix."""
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"].rsplit("-", 1)[0] == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} generated {kind}s named {name}")
    return found[0]


def workloads(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    yield from pod_specs(objects)


def containers(objects: list[Obj]) -> Iterator[tuple[Obj, Obj, Obj]]:
    """(workload, pod spec, container) for every container."""
    for workload, spec in workloads(objects):
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            yield workload, spec, container


def container_env(objects: list[Obj], container: Obj) -> dict[str, Any]:
    """The container's environment as kubelet builds it: envFrom ConfigMaps, then env."""
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        env.update(named(objects, "ConfigMap", ref)["data"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def port_number(container: Obj, port: int | str) -> int:
    if isinstance(port, int):
        return port
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            number: int = declared["containerPort"]
            return number
    raise LookupError(f"container {container['name']} has no port named {port}")
