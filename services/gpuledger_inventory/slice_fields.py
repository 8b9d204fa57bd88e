"""The values a ResourceSlice's devices are written with (pure): the driver's names, quantities in
the API server's canonical form, attribute strings, taints and times, shared by the cards' devices
(``slices``) and the MIG placements' (``slices_mig``)."""

from __future__ import annotations

import re
import time
from typing import Any

from gpuledger_core.errors import InvalidArgument

DRIVER = "gpu.gpuledger.io"
STANDARD = "resource.kubernetes.io"
MAX_STRING = 64  # DeviceAttributeMaxValueLength
TAINT_UNHEALTHY = f"{DRIVER}/unhealthy"
TAINT_HELD = f"{DRIVER}/held"  # the ledger gave (some of) the card to pods or tools outside DRA
MiB = 1024 * 1024

_BINARY = (("Ei", 1 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))
_NUMBER = re.compile(r"\d+")


def binary_quantity(n_bytes: int) -> str:
    """A byte count in the API server's canonical form (``25769803776`` -> ``24Gi``), so what comes
    back is what was sent."""
    if n_bytes < 0:
        raise InvalidArgument("quantity", f"must not be negative, got {n_bytes}")
    for suffix, unit in _BINARY:
        if n_bytes and n_bytes % unit == 0:
            return f"{n_bytes // unit}{suffix}"
    return str(n_bytes)


def semver(text: str) -> str | None:
    """NVIDIA's ``560.35.03`` or a compute capability ``8.6`` as a semantic version (``560.35.3``,
    ``8.6.0``): three numeric parts without leading zeros. None if the text has no number."""
    parts = [str(int(p)) for p in _NUMBER.findall(text)[:3]]
    if not parts:
        return None
    return ".".join(parts + ["0"] * (3 - len(parts)))


def string(text: str) -> dict[str, str]:
    """A string attribute, cut to the API's limit."""
    return {"string": text[:MAX_STRING]}


def label_value(text: str) -> str:
    """``text`` as a label value (a taint's value must be one)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")[:63].rstrip("-_.")
    return cleaned or "unhealthy"


def rfc3339(at: float) -> str:
    """A time as the API server writes a ``metav1.Time`` (whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(at)))


def unhealthy_taint(reason: str, since: float | None) -> dict[str, Any]:
    """``gpu.gpuledger.io/unhealthy=<reason>:NoSchedule`` (``timeAdded``: when it turned unhealthy)."""
    taint: dict[str, Any] = {"key": TAINT_UNHEALTHY, "value": label_value(reason), "effect": "NoSchedule"}
    if since is not None:
        taint["timeAdded"] = rfc3339(since)
    return taint


def held_taint(since: float) -> dict[str, Any]:
    """``gpu.gpuledger.io/held=outside-dra:NoSchedule``: the ledger gave it to a pod or a tool."""
    return {"key": TAINT_HELD, "value": "outside-dra", "effect": "NoSchedule", "timeAdded": rfc3339(since)}
