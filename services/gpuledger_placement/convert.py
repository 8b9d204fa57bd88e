"""The kube-scheduler extender's wire format and Kubernetes pods, to and from domain values, once.

The extender types (``k8s.io/kube-scheduler/extender/v1``) have no JSON tags, so their keys are the
Go field names (``NodeNames``, ``FailedNodes``, ``Host``, ``Score``, ...); the embedded Pod and
NodeList use the ordinary Kubernetes JSON (camelCase). Structural problems with a request raise
``BadRequest`` (HTTP 400); a well-formed pod whose gpuledger resources make no sense raises
``InvalidArgument`` (the pod is unschedulable, with the reason).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson

from gpuledger_core import codec, mig
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.model import CORE_WHOLE, Allocation, Isolation, Owner, OwnerKind, Request
from gpuledger_core.packing import POLICIES
from gpuledger_core.pods import PodAsk
from gpuledger_core.quantity import BINARY, parse_quantity
from gpuledger_core.quantity import MIB as MIB  # re-exported: pods' quantities are read here
from gpuledger_core.quantity import quantity as quantity

GPU = "gpuledger.io/gpu"
GPU_MEM = "gpuledger.io/gpu-mem"
GPU_CORE = "gpuledger.io/gpu-core"
MODEL_ANNOTATION = "gpuledger.io/gpu-model"
POLICY_ANNOTATION = "gpuledger.io/placement"
ISOLATION_ANNOTATION = "gpuledger.io/isolation"
ALLOCATION_ANNOTATION = "gpuledger.io/allocation"
PREEMPTION_ANNOTATION = "gpuledger.io/preemption"  # the victims a preemption evicted for the pod (preemptor.py)
_PLAIN = re.compile(r"[A-Za-z0-9._-]+")  # a node name that JSON takes as it is
_COUNT_LIMIT = 2**63  # no whole count of cards, MiB or percent comes near this


DEFAULT_SCHEDULER = "default-scheduler"  # what the API server sets when a pod names no scheduler


class BadRequest(InvalidArgument):
    """The request itself is malformed (not the pod's choices): HTTP 400."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    names: tuple[str, ...]
    items: Mapping[str, Any] | None = None  # the Node objects, when the scheduler sent full nodes


@dataclass(frozen=True, slots=True)
class BindArgs:
    name: str
    namespace: str
    uid: str
    node: str


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    node_name: str  # spec.nodeName: empty until the pod is bound
    scheduler_name: str = DEFAULT_SCHEDULER  # spec.schedulerName (the API server's default when unset)


# --- the extender's requests ---


def parse_json(body: bytes) -> Any:
    """A request body (orjson: filter's and bind's are on kube-scheduler's critical path)."""
    try:
        return orjson.loads(body)
    except ValueError as err:
        raise BadRequest("body", f"not valid JSON: {err}") from err


def extender_args_from(raw: Any) -> ExtenderArgs:
    if not isinstance(raw, dict):
        raise BadRequest("body", f"must be a JSON object (ExtenderArgs), got {type(raw).__name__}")
    pod = raw.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequest("Pod", "is required and must be an object")
    names = raw.get("NodeNames")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("NodeNames", "must be a list of node names")
        return ExtenderArgs(pod, tuple(names))
    nodes = raw.get("Nodes")
    if nodes is None:
        raise BadRequest("NodeNames", "is required (the extender is nodeCacheCapable), or Nodes")
    items = nodes.get("items") if isinstance(nodes, dict) else None
    if not isinstance(items, list):
        raise BadRequest("Nodes.items", "must be a list of nodes")
    by_name = {_node_name(item, i): item for i, item in enumerate(items)}
    return ExtenderArgs(pod, tuple(by_name), by_name)


def _node_name(item: Any, at: int) -> str:
    meta = item.get("metadata") if isinstance(item, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise BadRequest(f"Nodes.items[{at}].metadata.name", "is required")
    return name


def bind_args_from(raw: Any) -> BindArgs:
    if not isinstance(raw, dict):
        raise BadRequest("body", f"must be a JSON object (ExtenderBindingArgs), got {type(raw).__name__}")
    values = []
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = raw.get(key)
        if not isinstance(value, str) or not value:
            raise BadRequest(key, "is required and must be a non-empty string")
        values.append(value)
    return BindArgs(*values)


# --- the extender's replies ---


def filter_result_to(
    args: ExtenderArgs, fits: Sequence[str], failed: Mapping[str, str], unresolvable: Mapping[str, str], error: str = ""
) -> dict[str, Any]:
    nodes = None
    names: list[str] | None = list(fits)
    if args.items is not None:
        nodes, names = {"metadata": {}, "items": [args.items[n] for n in fits]}, None
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def filter_error_to(error: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": error}


def priorities_to(scores: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"Host": host, "Score": score} for host, score in scores.items()]


def priorities_json(scores: Mapping[str, int]) -> str:
    """``priorities_to`` encoded, twice as fast for the usual node names (which need no escaping)."""
    return "[" + ",".join(_priority(host, score) for host, score in scores.items()) + "]"


def _priority(host: str, score: int) -> str:
    if _PLAIN.fullmatch(host):
        return f'{{"Host":"{host}","Score":{int(score)}}}'
    return json.dumps({"Host": host, "Score": int(score)}, separators=(",", ":"))


def bind_result_to(error: str = "") -> dict[str, str]:
    return {"Error": error}


# --- pods ---


def pod_ref_from(pod: Mapping[str, Any]) -> PodRef:
    meta = _obj(pod, "metadata")
    spec = _obj(pod, "spec")
    return PodRef(
        str(meta.get("namespace") or "default"),
        str(meta.get("name") or ""),
        str(meta.get("uid") or ""),
        str(spec.get("nodeName") or ""),
        str(spec.get("schedulerName") or DEFAULT_SCHEDULER),
    )


def pod_ask_from(pod: Mapping[str, Any]) -> PodAsk:
    """What the pod asks of gpuledger; ``InvalidArgument`` naming the field when it makes no sense."""
    ref = pod_ref_from(pod)
    owner = Owner(OwnerKind.POD, ref.uid or f"{ref.namespace}/{ref.name}", ref.namespace, ref.name)
    annotations = _obj(_obj(pod, "metadata"), "annotations")
    spec = _obj(pod, "spec")
    models = _models(annotations.get(MODEL_ANNOTATION))
    inits = _containers(spec, "initContainers")
    apps = _containers(spec, "containers")
    asks = [
        ask
        for group, init in ((inits, True), (apps, False))
        for at, container in enumerate(group)
        if (ask := _container_ask(container, init, at, models)) is not None
    ]
    cpu_milli, memory_mib = _host_totals(inits, apps)
    return PodAsk(
        owner,
        tuple(asks),
        _isolation(annotations.get(ISOLATION_ANNOTATION)),
        _policy(annotations.get(POLICY_ANNOTATION)),
        cpu_milli,
        memory_mib,
        claims=bool(spec.get("resourceClaims")),
    )


def host_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The pod's CPU (millicores) and memory (MiB) requests as kube-scheduler counts them (the
    app containers' sum, or the largest init container if more); ``InvalidArgument`` for a
    quantity that is not one."""
    spec = _obj(pod, "spec")
    return _host_totals(_containers(spec, "initContainers"), _containers(spec, "containers"))


def _host_totals(inits: list[Mapping[str, Any]], apps: list[Mapping[str, Any]]) -> tuple[int, int]:
    cpu = max(sum(_host(c, "cpu") for c in apps), max((_host(c, "cpu") for c in inits), default=0))
    mem = max(sum(_host(c, "memory") for c in apps), max((_host(c, "memory") for c in inits), default=0))
    return int(cpu * 1000), int(mem / MIB)


def allocation_annotation(allocation: Allocation) -> str:
    return orjson.dumps(codec.allocation_to(allocation)).decode()


def _container_ask(container: Mapping[str, Any], init: bool, at: int, models: frozenset[str]) -> ContainerAsk | None:
    name = str(container.get("name") or "")
    where = f"spec.{'initContainers' if init else 'containers'}[{at}] ({name})"
    wanted = _extended(container)
    if not wanted:
        return None
    if any(mig.is_resource(key) for key in wanted):
        request = _mig_ask(wanted, where, models)
        if request is None:
            return None  # it asked for no instance (each count 0)
        if init:
            raise InvalidArgument(where, "asks for MIG instances in an init container: only app containers may")
        return ContainerAsk(name, request, init)
    if GPU not in wanted:
        raise InvalidArgument(where, f"{GPU_MEM} and {GPU_CORE} need {GPU} (the number of cards) beside them")
    count = _count(wanted[GPU], f"{where} {GPU}", "cards")
    mem = _count(wanted[GPU_MEM], f"{where} {GPU_MEM}", "MiB") if GPU_MEM in wanted else None
    core = _count(wanted[GPU_CORE], f"{where} {GPU_CORE}", "percent") if GPU_CORE in wanted else None
    if count == 0:
        return None
    if core is not None and not 1 <= core <= 100:
        raise InvalidArgument(f"{where} {GPU_CORE}", f"must be 1..100 percent of a card, got {core}")
    try:
        request = Request(count, mem, None if core is None else core * CORE_WHOLE // 100, models)
    except InvalidArgument as err:
        raise InvalidArgument(f"{where} {err.field}", err.problem) from err
    return ContainerAsk(name, request, init)


def _mig_ask(wanted: Mapping[str, Any], where: str, models: frozenset[str]) -> Request | None:
    """The MIG request of a container that asks for MIG instances (``mig.request_of``: a profile
    by name, or the smallest holding its gpu-mem and gpu-core); None when every count is 0."""
    if GPU in wanted:
        raise InvalidArgument(where, f"asks for {GPU} and MIG instances: a container takes one or the other")
    counts = {k: _count(v, f"{where} {k}", "instances") for k, v in wanted.items() if mig.is_resource(k)}
    mem = _count(wanted[GPU_MEM], f"{where} {GPU_MEM}", "MiB") if GPU_MEM in wanted else None
    core = _count(wanted[GPU_CORE], f"{where} {GPU_CORE}", "percent") if GPU_CORE in wanted else None
    if core is not None and not 1 <= core <= 100:
        raise InvalidArgument(f"{where} {GPU_CORE}", f"must be 1..100 percent of a card, got {core}")
    try:
        return mig.request_of(counts, mem, None if core is None else core * CORE_WHOLE // 100, models)
    except InvalidArgument as err:
        raise InvalidArgument(f"{where} {err.field}", err.problem) from err


def _extended(container: Mapping[str, Any]) -> dict[str, Any]:
    """gpuledger's resources of one container: limits, or requests where no limit is given."""
    resources = _obj(container, "resources")
    found: dict[str, Any] = {}
    for part in ("requests", "limits"):
        for key, value in _obj(resources, part).items():
            if key in (GPU, GPU_MEM, GPU_CORE) or mig.is_resource(key):
                found[key] = value
    return found


def _count(raw: Any, field: str, unit: str) -> int:
    """A gpuledger resource as a whole number of ``unit``: any Kubernetes quantity whose value is
    whole (``4k`` is 4000, as the API server writes 4000); fractions and binary suffixes refused."""
    value, suffix = parse_quantity(raw, field)
    text = str(raw).strip()
    if suffix in BINARY:
        raise InvalidArgument(field, _binary_problem(text, value, suffix, unit))
    if value != value.to_integral_value():
        raise InvalidArgument(field, f"must be a whole number of {unit}, got {text!r}")
    if value >= _COUNT_LIMIT:
        raise InvalidArgument(field, f"{text!r} is far too many {unit}")
    return int(value)


def _binary_problem(text: str, value: Decimal, suffix: str, unit: str) -> str:
    """Why a binary suffix is refused: ``gpu-mem: 2Gi`` means 2 GiB, which is 2048 (MiB) here."""
    if unit != "MiB":
        return f"is a count of {unit}: binary suffixes (Ki, Mi, Gi, ...) do not apply; write a number, not {text!r}"
    mib = value / MIB
    bytes_ = "is a count of MiB, not a size in bytes"
    if mib != mib.to_integral_value():
        return f"{bytes_}: {text!r} is not a whole number of MiB; write the MiB as a number"
    return f"{bytes_}: write {int(mib)} for {text[: -len(suffix)]} {suffix}B, not {text!r}"


def _host(container: Mapping[str, Any], resource: str) -> Decimal:
    resources = _obj(container, "resources")
    raw = _obj(resources, "requests").get(resource, _obj(resources, "limits").get(resource))
    return Decimal(0) if raw is None else quantity(raw, f"{container.get('name')}: {resource}")


def _models(raw: Any) -> frozenset[str]:
    if raw is None:
        return frozenset()
    return frozenset(m.strip() for m in str(raw).replace(",", "|").split("|") if m.strip())


def _isolation(raw: Any) -> Isolation:
    if raw is None or raw == "":
        return Isolation.NONE
    try:
        return Isolation(str(raw))
    except ValueError:
        choices = "|".join(i.value for i in Isolation)
        raise InvalidArgument(f"annotation {ISOLATION_ANNOTATION}", f"must be {choices}, got {raw!r}") from None


def _policy(raw: Any) -> str:
    if raw is None or raw == "":
        return ""
    if raw not in POLICIES:
        raise InvalidArgument(f"annotation {POLICY_ANNOTATION}", f"must be one of {', '.join(POLICIES)}, got {raw!r}")
    return str(raw)


def _obj(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = spec.get(key)
    return [c for c in value if isinstance(c, dict)] if isinstance(value, list) else []


def epoch_of(stamp: Any, default: float) -> float:
    """An API timestamp (RFC 3339, as ``2026-12-01T00:00:10Z``) in seconds since the epoch;
    ``default`` when there is none or it cannot be read."""
    if not isinstance(stamp, str):
        return default
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default
