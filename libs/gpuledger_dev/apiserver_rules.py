"""The API server's rules for the objects the fake keeps: what a pod becomes when it is created
(defaults, resources in canonical form, requests defaulted from limits), what validation refuses
(resources; a name, containers, images), what an update may not change, how a pod is deleted
(gracefully when bound to a node), and a Binding's preconditions.

Kept as the real kube-apiserver keeps them (v1.36; see tests/e2e/test_fake_contract.py), and only
as far as gpuledger's code and tests lean on them: the pod spec's other defaults and validations,
generateName, finalizers and scheduling gates are not modelled.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterator, Mapping
from decimal import Decimal
from enum import StrEnum
from typing import Any

from gpuledger_dev.apiserver_quantity import parse, stored
from gpuledger_dev.apiserver_status import FieldError

GRACE_S = 30  # spec.terminationGracePeriodSeconds when none is given
SPEC_DEFAULTS: Mapping[str, Any] = {
    "restartPolicy": "Always", "terminationGracePeriodSeconds": GRACE_S, "dnsPolicy": "ClusterFirst",
    "schedulerName": "default-scheduler",
}
CONTAINER_LISTS = ("initContainers", "containers")
UPDATABLE = ("activeDeadlineSeconds", "tolerations")  # besides the containers' images
SPEC_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


NO_LIMIT = "Limit must be set for non overcommitable resources"
SYSTEM_META = ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds")


class Undecodable(ValueError):
    """The body cannot be read as a Pod at all (the API server's 400, not a 422)."""


def defaulted(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``pod`` as the API server stores it: spec defaults, every container's resources in canonical
    form with requests defaulted from limits. ``Undecodable`` for a quantity that is not one."""
    result = copy.deepcopy(dict(pod))
    spec = result.setdefault("spec", {})
    for key, value in SPEC_DEFAULTS.items():
        spec.setdefault(key, value)
    for _, container in _containers(spec):
        container["resources"] = _resources(container.get("resources") or {})
    return result


def creation_errors(pod: Mapping[str, Any]) -> list[FieldError]:
    """What validation refuses in a new (defaulted) pod."""
    errors: list[FieldError] = []
    if not (pod.get("metadata") or {}).get("name"):
        errors.append(FieldError("metadata.name", "Required", "name or generateName is required"))
    spec = pod.get("spec") or {}
    if not spec.get("containers"):
        errors.append(FieldError("spec.containers", "Required", ""))
    for path, container in _containers(spec):
        for key in ("name", "image"):
            if not container.get(key):
                errors.append(FieldError(f"{path}.{key}", "Required", ""))
        errors.extend(_resource_errors(container.get("resources") or {}, f"{path}.resources"))
    return errors


def update_errors(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldError]:
    """What an update may not change in a pod's spec (both defaulted)."""
    if _fixed(old.get("spec") or {}) == _fixed(new.get("spec") or {}):
        return []
    return [FieldError("spec", "Forbidden", SPEC_FORBIDDEN)]


def qos_class(pod: Mapping[str, Any]) -> str:
    """Guaranteed (cpu and memory limits everywhere, requests equal), BestEffort (neither anywhere) or Burstable."""
    spec = pod.get("spec") or {}
    asked, guaranteed = False, True
    for _, container in _containers(spec):
        resources = container.get("resources") or {}
        limits, requests = _host(resources.get("limits")), _host(resources.get("requests"))
        asked = asked or bool(limits or requests)
        guaranteed = guaranteed and set(limits) == {"cpu", "memory"} and requests == limits
    return "Guaranteed" if asked and guaranteed else "Burstable" if asked else "BestEffort"


def _host(resources: Any) -> dict[str, Decimal]:
    found = {name: parse(str(value)).value for name, value in (resources or {}).items() if name in ("cpu", "memory")}
    return {name: value for name, value in found.items() if value}


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for key in CONTAINER_LISTS:
        for at, container in enumerate(spec.get(key) or []):
            if isinstance(container, dict):
                yield f"spec.{key}[{at}]", container


def _resources(resources: Mapping[str, Any]) -> dict[str, Any]:
    result = {key: value for key, value in resources.items() if key not in ("limits", "requests")}
    limits = _quantities(resources.get("limits") or {})
    requests = {**limits, **_quantities(resources.get("requests") or {})}
    if limits:
        result["limits"] = limits
    if requests:
        result["requests"] = requests
    return result


def _quantities(found: Mapping[str, Any]) -> dict[str, str]:
    try:
        return {name: stored(_text(value)) for name, value in sorted(found.items())}
    except ValueError as err:
        raise Undecodable(str(err)) from err


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"quantities must be strings or numbers, not {type(value).__name__}")
    return str(value)


def _resource_errors(resources: Mapping[str, Any], path: str) -> list[FieldError]:
    limits: Mapping[str, str] = resources.get("limits") or {}
    requests: Mapping[str, str] = resources.get("requests") or {}
    errors = [e for name, text in limits.items() for e in _value_errors(name, text, f"{path}.limits[{name}]")]
    for name, text in requests.items():
        errors.extend(_value_errors(name, text, f"{path}.requests[{name}]"))
        limit = limits.get(name)
        if limit is None:
            if not _overcommits(name):
                errors.append(FieldError(f"{path}.limits", "Required", NO_LIMIT))
            continue
        wanted, most = parse(text).value, parse(limit).value
        if wanted != most and not _overcommits(name):
            why = f"must be equal to {name} limit of {limit}"
        elif wanted > most:
            why = f"must be less than or equal to {name} limit of {limit}"
        else:
            continue
        errors.append(FieldError(f"{path}.requests", "Invalid", why, text))
    return errors


def _value_errors(name: str, text: str, path: str) -> list[FieldError]:
    value = parse(text).value
    errors = []
    if value < 0:
        errors.append(FieldError(path, "Invalid", "must be greater than or equal to 0", text))
    if _extended(name) and value != value.to_integral_value():
        errors.append(FieldError(path, "Invalid", "must be an integer", text))
    return errors


def _native(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def _extended(name: str) -> bool:
    return not _native(name) and not name.startswith("requests.")


def _overcommits(name: str) -> bool:
    return _native(name) and not name.startswith("hugepages-")


def _fixed(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec without what an update may change."""
    result = {key: value for key, value in spec.items() if key not in UPDATABLE}
    for key in CONTAINER_LISTS:
        if key in result:
            result[key] = [_without(c, "image") for c in result[key]]
    return result


def _without(container: Any, key: str) -> Any:
    return {k: v for k, v in container.items() if k != key} if isinstance(container, dict) else container


# --- updates, deletion and binding (any object's metadata; pods') ---


def immutable_errors(was: Mapping[str, Any], meta: Mapping[str, Any]) -> list[FieldError]:
    """A changed uid, or a deletion timestamp set by an update, is refused (both can only be kept)."""
    errors = []
    if meta.get("uid") and meta["uid"] != was.get("uid"):
        errors.append(FieldError("metadata.uid", "Invalid", "field is immutable", str(meta["uid"])))
    if meta.get("deletionTimestamp") and not was.get("deletionTimestamp"):
        stamp = str(meta["deletionTimestamp"])
        errors.append(FieldError("metadata.deletionTimestamp", "Invalid", "field is immutable", stamp))
    return errors


def keep_system_meta(was: Mapping[str, Any], meta: dict[str, Any]) -> None:
    """What only the server writes stays as it was (uid, timestamps, generation, resourceVersion)."""
    for key in (*SYSTEM_META, "resourceVersion"):
        meta.pop(key, None)
        if key in was:
            meta[key] = was[key]


class Deletion(StrEnum):
    UNCHANGED = "unchanged"  # a graceful deletion under way stands
    MARKED = "marked"  # deletionTimestamp and deletionGracePeriodSeconds set, or the grace shortened
    GONE = "gone"  # removed now


def delete(pod: dict[str, Any], asked: int | None) -> Deletion:
    """A DELETE of ``pod`` with ``gracePeriodSeconds=asked`` (None: not given), as ``rest.BeforeDelete``
    does it: a pod already being deleted may only have its grace shortened; one whose grace is 0 goes."""
    meta = pod["metadata"]
    current = meta.get("deletionGracePeriodSeconds")
    if meta.get("deletionTimestamp") and current:
        if asked is None or asked >= current:
            return Deletion.UNCHANGED
        started = parse_time(meta["deletionTimestamp"]) - datetime.timedelta(seconds=current)
        meta.update(deletionTimestamp=timestamp(started, asked), deletionGracePeriodSeconds=asked)
    elif not meta.get("deletionTimestamp"):
        grace = deletion_grace(pod, asked)
        meta.update(deletionTimestamp=timestamp(None, grace), deletionGracePeriodSeconds=grace)
        meta["generation"] = int(meta.get("generation") or 1) + 1
    return Deletion.MARKED if meta["deletionGracePeriodSeconds"] else Deletion.GONE


def deletion_grace(pod: Mapping[str, Any], asked: int | None) -> int:
    """The grace period of a pod's deletion, as the pod strategy decides it: asked, else the pod's
    own; unbound or finished pods go at once; negative means 1."""
    spec, phase = pod.get("spec") or {}, (pod.get("status") or {}).get("phase")
    grace = asked if asked is not None else int(spec.get("terminationGracePeriodSeconds") or 0)
    if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
        return 0
    return 1 if grace < 0 else grace


def binding_precondition(pod: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """Why a Binding's UID or resourceVersion precondition fails (empty when it holds), in etcd storage's words."""
    have = pod["metadata"]
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = meta.get(field)
        if wanted and wanted != have.get(field):
            key = f"/registry/pods/{have.get('namespace')}/{have['name']}"
            failed = f"{label} in precondition: {wanted}, {label} in object meta: {have.get(field)}"
            return (f"StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, "
                    f"AdditionalErrorMsg: Precondition failed: {failed}")
    return ""


def timestamp(start: datetime.datetime | None = None, after_s: int = 0) -> str:
    """RFC 3339 in seconds, UTC, as metadata timestamps are written."""
    moment = (start or datetime.datetime.now(datetime.UTC)) + datetime.timedelta(seconds=after_s)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(stamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
