"""What a ResourceClaim asks of gpuledger's cards, in the terms of classic placement (pure): for
DRA mode C, where the ledger allocates the claim with the same policies as a classic pod
(docs/dra-mode-c.md).

Each request of the claim becomes one ``RequestAsk``: an ``exactly`` request has one choice, a
``firstAvailable`` request its subrequests in order (the first that fits wins, and its result
is named ``<request>/<subrequest>``, as kube-scheduler names it). A choice is a classic
``Request``: ``count`` cards, whole when the claim asks no capacity, else a share of ``memory``
(rounded up to the slices' grid of ``memory_step_mib``, as kube-scheduler rounds a request up to
the capacity's next valid value) and ``compute`` (percent). ``matchAttribute`` on one of the
NVLink group attributes makes the requests it names ``linked``: their cards must share a group.
The isolation is the class's, then the claim's, opaque ``SharingConfig`` (as
``claims.isolation_of`` reads it from an allocation).

What mode C does not allocate is refused with ``InvalidArgument`` naming the field (the caller
leaves such a claim to kube-scheduler, mode B): ``allocationMode: All``, CEL selectors, admin
access or tolerations in the claim, a capacity other than ``memory``, ``compute`` and
``slots: 1``, ``compute`` without ``memory``, another constraint, a class that is not one of
gpuledger's mode-C classes beside one that is, or a class whose CEL selectors test more than the
ledger decides by itself (``class_problem``: the driver, and the isolation tier a ``tenancy`` test
keeps apart, which the ledger keeps apart too). A claim none of whose classes is gpuledger's is
not ours (``None``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuledger_core.claim_asks_mig import has_profile, is_mig_class, mig_request
from gpuledger_core.claims import MEMORY_STEP_MIB, ClaimRef, isolation_among, ref_of
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import MAX_CARDS_PER_REQUEST, Isolation, Request
from gpuledger_core.nvlink import GROUP_SIZES, Linked
from gpuledger_core.quantity import MIB, whole_up

LINK_ATTRIBUTES = tuple(f"nvlinkGroup{size}" for size in GROUP_SIZES)
CAPACITIES = ("memory", "compute", "slots")


@dataclass(frozen=True, slots=True)
class RequestAsk:
    name: str
    choices: tuple[tuple[str, Request], ...]  # (the result's request name, what it asks), in order


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    ref: ClaimRef
    requests: tuple[RequestAsk, ...]
    isolation: Isolation = Isolation.NONE
    linked: tuple[Linked, ...] = ()  # requests whose cards must all be in one NVLink group


def claim_ask(
    claim: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    driver: str,
    memory_step_mib: int = MEMORY_STEP_MIB,
) -> ClaimAsk | None:
    """The claim's ask, None when it asks nothing of ``classes`` (gpuledger's mode-C
    DeviceClasses by name, each as the API server holds it)."""
    ref = ref_of(claim)
    devices = (claim.get("spec") or {}).get("devices") or {}
    raw_requests = devices.get("requests") or []
    used = {c for r in raw_requests for c in _classes_of(r)}
    if not used & set(classes):
        return None
    where = ref.describe()
    foreign = sorted(used - set(classes))
    if foreign:
        problem = f"{where}: device classes {', '.join(foreign)} beside gpuledger's"
        raise InvalidArgument("spec.devices.requests", problem)
    for name in sorted(used):
        problem = class_problem(classes[name], driver)
        if problem:
            raise InvalidArgument("spec.devices.requests", f"{where}: {problem}")
    mig = {name for name in used if is_mig_class(classes[name], driver)}
    requests = tuple(_request(r, i, where, memory_step_mib, mig, driver) for i, r in enumerate(raw_requests))
    names = [r.name for r in requests]
    linked = tuple(_constraint(c, i, names, driver, where) for i, c in enumerate(devices.get("constraints") or []))
    _check_linked(linked, requests, where)
    isolation = _isolation(claim, requests, classes, driver, where)
    return ClaimAsk(ref, requests, isolation, linked)


def class_problem(device_class: Mapping[str, Any], driver: str) -> str:
    """What in the class's CEL selectors mode C would not honour; empty when nothing. A selector is
    a conjunction (``&&``) of tests, each of which must be one the ledger decides as well: the
    device's driver, or the card's ``tenancy`` tier (the ledger keeps isolation tiers apart by
    itself). Anything else (a model, a memory size, an attribute of another driver) would be
    silently ignored by the ledger's choice, so its claims are left to kube-scheduler."""
    known = {
        f'device.driver == "{driver}"',
        f'device.attributes["{driver}"].tenancy != "mps"',
        f'device.attributes["{driver}"].tenancy != "none"',
        has_profile(driver),  # the MIG class: the placements (docs/mig.md)
        f"!{has_profile(driver)}",  # the card classes: the cards, no placement
    }
    name = (device_class.get("metadata") or {}).get("name", "")
    for selector in (device_class.get("spec") or {}).get("selectors") or []:
        expression = str((selector.get("cel") or {}).get("expression", ""))
        for test in expression.split("&&"):
            said = " ".join(test.split())
            if said not in known:
                return f"device class {name} selects by {said!r}, which gpuledger's choice does not evaluate"
    return ""


def _classes_of(request: Mapping[str, Any]) -> list[str]:
    if request.get("exactly"):
        return [str(request["exactly"].get("deviceClassName", ""))]
    return [str(s.get("deviceClassName", "")) for s in request.get("firstAvailable") or []]


def _request(raw: Mapping[str, Any], index: int, where: str, step: int, mig: set[str], driver: str) -> RequestAsk:
    name = str(raw.get("name", ""))
    field = f"spec.devices.requests[{index}]"
    if raw.get("exactly"):
        return RequestAsk(name, ((name, _choice(raw["exactly"], f"{field}.exactly", where, step, mig, driver)),))
    subs = raw.get("firstAvailable") or []
    if not subs:
        raise InvalidArgument(field, f"{where}: request {name!r} has neither exactly nor firstAvailable")
    choices = tuple(
        (f"{name}/{s.get('name', '')}", _choice(s, f"{field}.firstAvailable[{i}]", where, step, mig, driver))
        for i, s in enumerate(subs)
    )
    return RequestAsk(name, choices)


def _choice(raw: Mapping[str, Any], field: str, where: str, step: int, mig: set[str], driver: str) -> Request:
    mode = raw.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise InvalidArgument(f"{field}.allocationMode", f"{where}: allocationMode {mode} is left to kube-scheduler")
    of_mig = str(raw.get("deviceClassName", "")) in mig
    refused = (("adminAccess", "admin access"), ("tolerations", "tolerations"))
    for key, what in ((("selectors", "CEL selectors"),) if not of_mig else ()) + refused:
        if raw.get(key):
            raise InvalidArgument(f"{field}.{key}", f"{where}: {what} in a claim are left to kube-scheduler")
    count = int(raw.get("count") or 1)
    if not 1 <= count <= MAX_CARDS_PER_REQUEST:
        raise InvalidArgument(f"{field}.count", f"{where}: must be 1..{MAX_CARDS_PER_REQUEST} cards, got {count}")
    if of_mig:
        return mig_request(raw, count, field, where, driver)
    asked = ((raw.get("capacity") or {}).get("requests")) or {}
    unknown = sorted(set(asked) - set(CAPACITIES))
    if unknown:
        raise InvalidArgument(f"{field}.capacity.requests", f"{where}: unknown capacities {', '.join(unknown)}")
    if "slots" in asked and whole_up(asked["slots"], f"{field}.capacity.requests.slots") != 1:
        raise InvalidArgument(f"{field}.capacity.requests.slots", f"{where}: a device takes one slot per claim")
    if "memory" not in asked:
        if "compute" in asked:
            problem = f"{where}: compute without memory takes all of a card's memory; ask memory too, or no capacity"
            raise InvalidArgument(f"{field}.capacity.requests", problem)
        return Request(count)  # no capacity: every default, the whole card
    memory = whole_up(asked["memory"], f"{field}.capacity.requests.memory")
    mem_mib = -(-memory // (step * MIB)) * step  # up to the grid
    percent = whole_up(asked["compute"], f"{field}.capacity.requests.compute") if "compute" in asked else 100
    if not 1 <= percent <= 100:
        raise InvalidArgument(f"{field}.capacity.requests.compute", f"{where}: must be 1..100 percent, got {percent}")
    return Request(count, mem_mib, percent * 10)


def _constraint(raw: Mapping[str, Any], index: int, names: Sequence[str], driver: str, where: str) -> Linked:
    field = f"spec.devices.constraints[{index}]"
    attribute = str(raw.get("matchAttribute") or "")
    known = [f"{driver}/{a}" for a in LINK_ATTRIBUTES]
    if raw.get("distinctAttribute") or attribute not in known:
        said = attribute or raw.get("distinctAttribute") or "an empty constraint"
        problem = f"{where}: constraint {said} is left to kube-scheduler (known: {', '.join(known)})"
        raise InvalidArgument(field, problem)
    requests = [str(r) for r in raw.get("requests") or []] or list(names)
    missing = sorted({r.split("/", 1)[0] for r in requests} - set(names))
    if missing:
        raise InvalidArgument(f"{field}.requests", f"{where}: names no request {', '.join(missing)}")
    size = int(attribute.removeprefix(f"{driver}/nvlinkGroup"))
    return Linked(size, tuple(dict.fromkeys(r.split("/", 1)[0] for r in requests)))


def _check_linked(linked: Sequence[Linked], requests: Sequence[RequestAsk], where: str) -> None:
    """MIG placements carry no NVLink group: a request of them cannot be linked."""
    of_mig = {r.name for r in requests if any(request.mig for _, request in r.choices)}
    for constraint in linked:
        named = sorted(of_mig & set(constraint.containers))
        if named:
            problem = f"{where}: MIG request {', '.join(named)} in an NVLink constraint (a placement has no group)"
            raise InvalidArgument("spec.devices.constraints", problem)


def _isolation(
    claim: Mapping[str, Any],
    requests: Sequence[RequestAsk],
    classes: Mapping[str, Mapping[str, Any]],
    driver: str,
    where: str,
) -> Isolation:
    """The isolation each request gets (its class's config first, then the claim's, the later
    winning); one for the whole claim, as the ledger holds one per allocation."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    claim_configs = devices.get("config") or []
    raw_requests = {str(r.get("name", "")): r for r in devices.get("requests") or []}
    found: set[Isolation] = set()
    for request in requests:
        for chosen, _ in request.choices:
            class_name = _class_of(raw_requests[request.name], chosen)
            class_configs = ((classes.get(class_name) or {}).get("spec") or {}).get("config") or []
            configs = [*class_configs, *claim_configs]
            found.add(isolation_among(configs, driver, {request.name, chosen}, ref_of(claim)))
    if len(found) > 1:
        raise InvalidArgument("spec.devices.config", f"{where}: its requests ask for isolation none and mps at once")
    return found.pop() if found else Isolation.NONE


def _class_of(raw: Mapping[str, Any], chosen: str) -> str:
    if raw.get("exactly"):
        return str(raw["exactly"].get("deviceClassName", ""))
    sub = chosen.split("/", 1)[1]
    return next(str(s.get("deviceClassName", "")) for s in raw.get("firstAvailable") or [] if s.get("name") == sub)
