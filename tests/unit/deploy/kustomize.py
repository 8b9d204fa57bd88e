"""The part of kustomize that deploy/kubernetes uses, in Python, so the tests need no binary.

Supported: ``resources`` (files and directories), ``configMapGenerator`` and ``secretGenerator``
(``files``, ``literals``, ``behavior`` create/merge/replace, ``options.disableNameSuffixHash``),
``patches`` (strategic merge, from ``path`` or inline ``patch``, addressed by the patch's own kind
and name; ``$patch: delete``), ``replicas``, ``images`` and ``labels`` (metadata only). Anything
else in a kustomization is an error, so a manifest change that needs more of kustomize fails here
instead of rendering differently. Generated names get kustomize's content hash and references to
them in pod specs are rewritten, as kustomize does; where a kustomize binary is present, a test
compares the two renderings.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

KNOWN_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "configMapGenerator",
    "secretGenerator",
    "patches",
    "replicas",
    "images",
    "labels",
}
GENERATOR_FIELDS = {"name", "namespace", "files", "literals", "behavior", "options", "type"}
# Strategic-merge keys of the list fields the manifests patch (from the Kubernetes API types).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "envFrom": None,
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
HASHED = "gpuledger.test/hash-suffix"  # internal marker, removed before the result is returned


class KustomizeError(ValueError):
    pass


@dataclass
class Build:
    objects: list[Obj] = field(default_factory=list)

    def find(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        for obj in self.objects:
            meta = obj["metadata"]
            if obj["kind"] == kind and meta["name"] == name and (namespace in (None, meta.get("namespace"))):
                return obj
        return None


def build(directory: Path) -> list[Obj]:
    """Render the kustomization in ``directory`` like ``kustomize build``."""
    result = _build(directory.resolve())
    _apply_hashes(result.objects)
    return result.objects


def _build(directory: Path) -> Build:
    spec = _load_kustomization(directory)
    result = Build()
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            result.objects.extend(_build(path).objects)
        else:
            result.objects.extend(_load_documents(path))
    for generator in spec.get("configMapGenerator", []):
        _generate(result, directory, generator, "ConfigMap")
    for generator in spec.get("secretGenerator", []):
        _generate(result, directory, generator, "Secret")
    for patch in spec.get("patches", []):
        _patch(result, directory, patch)
    for replicas in spec.get("replicas", []):
        _set_replicas(result, replicas)
    for image in spec.get("images", []):
        _set_image(result, image)
    for labels in spec.get("labels", []):
        _add_labels(result, labels)
    return result


def _load_kustomization(directory: Path) -> Obj:
    path = directory / "kustomization.yaml"
    if not path.exists():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise KustomizeError(f"{path}: fields this renderer does not implement: {sorted(unknown)}")
    return dict(spec)


def _load_documents(path: Path) -> Iterator[Obj]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is not None:
            yield doc


def _generate(result: Build, directory: Path, generator: Obj, kind: str) -> None:
    unknown = set(generator) - GENERATOR_FIELDS
    if unknown:
        raise KustomizeError(f"{kind} generator {generator.get('name')}: unsupported {sorted(unknown)}")
    data: dict[str, str] = {}
    for entry in generator.get("files", []):
        key, _, source = str(entry).rpartition("=") if "=" in str(entry) else ("", "", str(entry))
        data[key or Path(source).name] = (directory / source).read_text()
    for literal in generator.get("literals", []):
        key, _, value = str(literal).partition("=")
        data[key] = value
    name, namespace = generator["name"], generator.get("namespace")
    behavior = generator.get("behavior", "create")
    existing = result.find(kind, name, namespace)
    if behavior == "create":
        if existing is not None:
            raise KustomizeError(f"{kind} {name} generated twice (use behavior merge or replace)")
        result.objects.append(_generated(kind, name, namespace, data, generator))
    elif existing is None:
        raise KustomizeError(f"{kind} {name}: behavior {behavior} but no such generated object")
    elif behavior == "merge":
        existing["data"] = {**existing["data"], **_encode(kind, data)}
    elif behavior == "replace":
        existing["data"] = _encode(kind, data)
    else:
        raise KustomizeError(f"{kind} {name}: unknown behavior {behavior!r}")


def _generated(kind: str, name: str, namespace: str | None, data: dict[str, str], generator: Obj) -> Obj:
    meta: Obj = {"name": name, "annotations": {}}
    if namespace:
        meta["namespace"] = namespace
    if not generator.get("options", {}).get("disableNameSuffixHash", False):
        meta["annotations"][HASHED] = "true"
    obj: Obj = {"apiVersion": "v1", "kind": kind, "metadata": meta, "data": _encode(kind, data)}
    if kind == "Secret":
        obj["type"] = generator.get("type", "Opaque")
    return obj


def _encode(kind: str, data: dict[str, str]) -> dict[str, str]:
    if kind == "Secret":
        return {k: _base64(v) for k, v in data.items()}
    return dict(data)


def _base64(value: str) -> str:
    """A Secret's value as kustomize writes it: base64, in lines of 70 when it is longer (the
    hash suffix is of this text, line breaks and all)."""
    encoded = base64.b64encode(value.encode()).decode()
    if len(encoded) <= 70:
        return encoded
    return "".join(encoded[i : i + 70] + "\n" for i in range(0, len(encoded), 70))


def _patch(result: Build, directory: Path, entry: Obj) -> None:
    if set(entry) - {"path", "patch"}:
        raise KustomizeError(f"patch {entry}: only path or patch (strategic merge) is implemented")
    text = (directory / entry["path"]).read_text() if "path" in entry else entry["patch"]
    for patch in yaml.safe_load_all(text):
        meta = patch["metadata"]
        target = result.find(patch["kind"], meta["name"], meta.get("namespace"))
        if target is None:
            raise KustomizeError(f"patch for {patch['kind']}/{meta['name']}: no such object")
        if patch.get("$patch") == "delete":
            result.objects.remove(target)
        else:
            merge(target, patch)


def merge(base: Obj, patch: Obj) -> None:
    """Strategic merge of ``patch`` into ``base``, for the fields in ``MERGE_KEYS``."""
    for key, value in patch.items():
        if key == "$patch":
            continue
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        elif isinstance(value, list) and MERGE_KEYS.get(key) and isinstance(base.get(key), list):
            _merge_list(base[key], value, MERGE_KEYS[key] or "")
        else:
            base[key] = copy.deepcopy(value)


def _merge_list(base: list[Obj], patch: list[Obj], key: str) -> None:
    added: list[Obj] = []  # kustomize puts items new to the list first, in the patch's order
    for item in patch:
        match = next((b for b in base if b.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if match is not None:
                base.remove(match)
        elif match is None:
            added.append(copy.deepcopy(item))
        else:
            merge(match, item)
    base[:0] = added


def _set_replicas(result: Build, entry: Obj) -> None:
    found = [o for o in result.objects if o["metadata"]["name"] == entry["name"] and "replicas" in o.get("spec", {})]
    if not found:
        raise KustomizeError(f"replicas: no object {entry['name']} with spec.replicas")
    for obj in found:
        obj["spec"]["replicas"] = entry["count"]


def _set_image(result: Build, entry: Obj) -> None:
    for container in _containers(result.objects):
        name, tag = _split_image(container["image"])
        if name != entry["name"]:
            continue
        name = entry.get("newName", name)
        tag = entry.get("newTag", tag)
        container["image"] = f"{name}@{entry['digest']}" if "digest" in entry else f"{name}:{tag}" if tag else name


def _split_image(image: str) -> tuple[str, str]:
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1 :]
    return image, ""


def _add_labels(result: Build, entry: Obj) -> None:
    if entry.get("includeSelectors") or entry.get("includeTemplates"):
        raise KustomizeError("labels: only metadata labels (no selectors or templates) are implemented")
    for obj in result.objects:
        obj["metadata"].setdefault("labels", {}).update(entry["pairs"])


def pod_specs(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(workload, pod spec) for every workload."""
    for obj in objects:
        if obj["kind"] in WORKLOADS:
            yield obj, obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield obj, obj["spec"]


def _containers(objects: list[Obj]) -> Iterator[Obj]:
    for _, spec in pod_specs(objects):
        yield from spec.get("initContainers", [])
        yield from spec.get("containers", [])


def _apply_hashes(objects: list[Obj]) -> None:
    renamed: dict[tuple[str, str | None, str], str] = {}
    for obj in objects:
        meta = obj["metadata"]
        annotations = meta.get("annotations", {})
        if annotations.pop(HASHED, None):
            new = f"{meta['name']}-{content_hash(obj)}"
            renamed[(obj["kind"], meta.get("namespace"), meta["name"])] = new
            meta["name"] = new
        if "annotations" in meta and not meta["annotations"]:
            del meta["annotations"]
    for workload, spec in pod_specs(objects):
        namespace = workload["metadata"].get("namespace")
        for ref in _references(spec):
            kind, holder, key = ref
            new_name = renamed.get((kind, namespace, holder[key]))
            if new_name:
                holder[key] = new_name


def _references(spec: Obj) -> Iterator[tuple[str, Obj, str]]:
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"], "name"
        if "secret" in volume:
            yield "Secret", volume["secret"], "secretName"
        for source in volume.get("projected", {}).get("sources", []):
            if "configMap" in source:
                yield "ConfigMap", source["configMap"], "name"
            if "secret" in source:
                yield "Secret", source["secret"], "name"
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for env in container.get("env", []):
            ref = env.get("valueFrom", {})
            if "configMapKeyRef" in ref:
                yield "ConfigMap", ref["configMapKeyRef"], "name"
            if "secretKeyRef" in ref:
                yield "Secret", ref["secretKeyRef"], "name"
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                yield "ConfigMap", source["configMapRef"], "name"
            if "secretRef" in source:
                yield "Secret", source["secretRef"], "name"


def content_hash(obj: Obj) -> str:
    """kustomize's name suffix: sha256 of the object's kind and data as Go's JSON, 10 chars.

    kustomize hashes the generated object before it has a name, so ``name`` is empty.
    """
    encoded: Obj = {"kind": obj["kind"], "name": "", "data": obj.get("data", {})}
    if obj["kind"] == "Secret":
        encoded["type"] = obj.get("type", "Opaque")
    text = json.dumps(encoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))
