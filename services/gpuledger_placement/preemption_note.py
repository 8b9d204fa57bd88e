"""The ``gpuledger.io/preemption`` annotation a preempting pod carries (preemptor.py): where its
room is held, since when, for how long, and which pods were evicted for it. Its bind waits until
those pods are gone (``Binder``); another placement replica reads it before preempting again."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuledger_placement.convert import PREEMPTION_ANNOTATION

__all__ = ["PREEMPTION_ANNOTATION", "Preemption", "preemption_of"]


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
