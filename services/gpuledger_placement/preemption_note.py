"""The ``gpuledger.io/preemption`` annotation a preempting pod carries (preemptor.py): where its
room is held, since when, for how long, and which pods were evicted for it. Its bind (or in DRA
mode C the lift of its gate) waits until those pods are gone (``Binder``, ``ClaimAllocator``);
another placement replica reads it before preempting again."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuledger_core.errors import NotFound
from gpuledger_placement.convert import PREEMPTION_ANNOTATION

__all__ = ["PREEMPTION_ANNOTATION", "Preemption", "preemption_of", "victim_left"]


@dataclass(frozen=True, slots=True)
class Preemption:
    """The ``gpuledger.io/preemption`` annotation: where the pod's room is held, since when, for how
    long, and the victims ("namespace/name/uid") whose pods must be gone before it binds."""

    node: str
    at: float
    hold_s: float
    victims: tuple[str, ...]
    held: bool = False  # the room is held in the ledger (written after the evictions)

    def encode(self) -> str:
        doc = {"node": self.node, "at": self.at, "holdSeconds": self.hold_s, "victims": self.victims, "held": self.held}
        return json.dumps(doc, separators=(",", ":"))


def preemption_of(pod: Mapping[str, Any]) -> Preemption | None:
    """The pod's preemption annotation; None when it has none or it is not ours to read."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(PREEMPTION_ANNOTATION)
    if not text:
        return None
    try:
        doc = json.loads(text)
        return Preemption(str(doc["node"]), float(doc["at"]), float(doc["holdSeconds"]),
                          tuple(str(v) for v in doc["victims"]), bool(doc.get("held", False)))  # fmt: skip
    except (ValueError, KeyError, TypeError):
        return None


async def victim_left(pod: Mapping[str, Any], get_pod: Callable[[str, str], Awaitable[Mapping[str, Any]]]) -> str:
    """The first pod evicted for ``pod`` that still exists ("namespace/name"; in its grace period
    its containers may still use the cards held for ``pod``), or "" when all are gone."""
    found = preemption_of(pod)
    for victim in found.victims if found is not None else ():
        namespace, name, uid = [*victim.split("/"), "", ""][:3]
        try:
            still = ((await get_pod(namespace, name)).get("metadata") or {}).get("uid") == uid
        except NotFound:
            still = False
        if still:
            return f"{namespace}/{name}"
    return ""
