"""The Node labels the inventory owns, in the spirit of GPU Feature Discovery: pure functions.

Every label under ``gpuledger.io/gpu.`` belongs to the inventory; nothing else is touched. The
patch sets the labels that changed and removes (``None`` in a JSON merge patch) owned labels that
no longer apply.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

from gpuledger_inventory.inventory import MigMode, Scan

PREFIX = "gpuledger.io/gpu."
_FAMILIES = {
    (10, None): "blackwell",
    (9, None): "hopper",
    (8, 9): "ada-lovelace",
    (8, None): "ampere",
    (7, 5): "turing",
    (7, None): "volta",
    (6, None): "pascal",
    (5, None): "maxwell",
    (3, None): "kepler",
}
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """A valid label value: letters, digits, ``-_.``; at most 63 characters; alphanumeric ends."""
    return _UNSAFE.sub("-", text).strip("-_.")[:63].rstrip("-_.")


def family(capability: tuple[int, int] | None) -> str:
    if capability is None:
        return "unknown"
    major, minor = capability
    return _FAMILIES.get((major, minor)) or _FAMILIES.get((major, None)) or "unknown"


def node_labels(scan: Scan) -> dict[str, str]:
    """The owned labels for what the scan found (no cards: only the count)."""
    cards = scan.cards
    labels = {f"{PREFIX}count": str(len(cards))}
    if not cards:
        return labels
    product, _ = Counter(c.card.model for c in cards).most_common(1)[0]
    first = next(c for c in cards if c.card.model == product)
    labels[f"{PREFIX}product"] = label_value(product)
    labels[f"{PREFIX}memory"] = str(
        min(c.card.memory_mib for c in cards if c.card.model == product)
    )
    labels[f"{PREFIX}family"] = family(first.compute_capability)
    if first.compute_capability is not None:
        labels[f"{PREFIX}compute.major"] = str(first.compute_capability[0])
        labels[f"{PREFIX}compute.minor"] = str(first.compute_capability[1])
    if scan.driver_version:
        labels[f"{PREFIX}driver"] = label_value(scan.driver_version)
    if scan.cuda_version:
        labels[f"{PREFIX}cuda"] = label_value(scan.cuda_version)
    labels[f"{PREFIX}nvlink"] = _flag(any(link.nvlinks for link in scan.links))
    labels[f"{PREFIX}nvswitch"] = _flag(any(c.nvswitch_links for c in cards))
    capable = [c for c in cards if c.mig_mode is not MigMode.UNKNOWN and _mig_capable(c.card.model)]
    labels[f"{PREFIX}mig.capable"] = _flag(bool(capable))
    labels[f"{PREFIX}mig.enabled"] = _flag(any(c.mig_mode is MigMode.ENABLED for c in cards))
    return labels


def _mig_capable(model: str) -> bool:
    return any(m in model for m in ("A100", "A30", "H100", "H200", "H800", "B200", "GB200"))


def _flag(value: bool) -> str:
    return "true" if value else "false"


def label_patch(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str | None]:
    """A JSON merge patch of ``metadata.labels`` that touches only the owned labels."""
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    patch.update({k: None for k in current if k.startswith(PREFIX) and k not in desired})
    return patch
