"""What a ResourceClaim request of the MIG DeviceClass asks, as a classic ``Request(mig=...)``
(pure; DRA mode C, docs/mig.md "DRA: partitionable devices").

The class ``mig.gpu.gpuledger.io`` selects the devices with a ``profile`` attribute (the MIG
placements the slices publish, ``slices_mig``). A request of it asks for ``count`` instances, one
per card (as ``gpuledger.io/mig-<profile>: N`` asks), either

- of a named profile, by one CEL selector in the claim that the ledger reads:
  ``device.attributes["gpu.gpuledger.io"].profile == "1g.10gb"`` (nothing else in it), or
- of the smallest profile holding a memory and/or compute ask, ``capacity.requests`` of ``memory``
  (bytes, up to whole MiB, no grid: a placement's memory is what its profile has) and ``compute``
  (percent of the card's compute): kube-scheduler filters the placements' capacities the same way
  (``capacity.requests`` is a lower bound on a device that takes one allocation).

Refused with ``InvalidArgument`` naming the field (the caller leaves such a claim to
kube-scheduler): another selector, several, a profile no card model offers, a profile and capacity
at once, neither, a capacity other than ``memory`` and ``compute``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.mig import unknown_profile
from gpuledger_core.model import CORE_WHOLE, MIG_SMALLEST, Request
from gpuledger_core.quantity import MIB, whole_up

CAPACITIES = ("memory", "compute")


def has_profile(driver: str) -> str:
    """The test the MIG class selects by (and the card classes negate)."""
    return f'has(device.attributes["{driver}"].profile)'


def is_mig_class(device_class: Mapping[str, Any], driver: str) -> bool:
    """Whether the class selects MIG placements: one of its selectors' tests is ``has_profile``."""
    for selector in (device_class.get("spec") or {}).get("selectors") or []:
        expression = str((selector.get("cel") or {}).get("expression", ""))
        if has_profile(driver) in (" ".join(t.split()) for t in expression.split("&&")):
            return True
    return False


def mig_request(raw: Mapping[str, Any], count: int, field: str, where: str, driver: str) -> Request:
    """The ``Request`` of one request (or subrequest) of the MIG class; ``raw`` is its ``exactly``
    or its subrequest."""
    profile = _profile(raw.get("selectors") or [], f"{field}.selectors", where, driver)
    asked = ((raw.get("capacity") or {}).get("requests")) or {}
    unknown = sorted(set(asked) - set(CAPACITIES))
    if unknown:
        problem = f"{where}: a MIG placement has capacities {', '.join(CAPACITIES)}, not {', '.join(unknown)}"
        raise InvalidArgument(f"{field}.capacity.requests", problem)
    if profile and asked:
        problem = f"{where}: profile {profile} names its memory and compute: ask no capacity beside it"
        raise InvalidArgument(f"{field}.capacity.requests", problem)
    if profile:
        return Request(count, mig=profile)
    if not asked:
        problem = f"{where}: a MIG request names a profile (a selector on the profile attribute) or asks memory"
        raise InvalidArgument(f"{field}.selectors", problem)
    mem_mib = -(-whole_up(asked["memory"], f"{field}.capacity.requests.memory") // MIB) if "memory" in asked else None
    core = whole_up(asked["compute"], f"{field}.capacity.requests.compute") if "compute" in asked else None
    if core is not None and not 1 <= core <= 100:
        raise InvalidArgument(f"{field}.capacity.requests.compute", f"{where}: must be 1..100 percent, got {core}")
    if mem_mib == 0:
        raise InvalidArgument(f"{field}.capacity.requests.memory", f"{where}: must be more than nothing")
    return Request(count, mem_mib, None if core is None else core * CORE_WHOLE // 100, mig=MIG_SMALLEST)


def _profile(selectors: Sequence[Mapping[str, Any]], field: str, where: str, driver: str) -> str:
    """The profile the claim's one selector names; empty without a selector."""
    if not selectors:
        return ""
    wanted = re.compile(rf'device\.attributes\[(["\']){re.escape(driver)}\1\]\.profile == (["\'])([^"\']+)\2')
    expressions = [" ".join(str((s.get("cel") or {}).get("expression", "")).split()) for s in selectors]
    found = wanted.fullmatch(expressions[0]) if len(expressions) == 1 else None
    if found is None:
        said = " and ".join(repr(e) for e in expressions)
        example = f'device.attributes["{driver}"].profile == "1g.10gb"'
        problem = f"{where}: the ledger reads one selector of a MIG request, {example!r}, not {said}"
        raise InvalidArgument(field, problem)
    profile = found[3]
    unknown = unknown_profile(profile)
    if unknown:
        raise InvalidArgument(field, f"{where}: {unknown}")
    return profile
