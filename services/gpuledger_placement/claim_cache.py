"""The ResourceClaims the claims controller's list and watch brought, by namespace and name: mode C
reads a claim here before it asks the API server, and waits here until a claim it allocated comes
back allocated (``seen_allocated``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuledger_core import claims
from gpuledger_placement import claim_fields as fields


@dataclass(slots=True)
class ClaimCache:
    _seen: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)  # (namespace, name) -> newest
    _awaited: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)  # set when a new version comes
    on_added: Callable[[Mapping[str, Any]], None] | None = None  # told of each claim a watch brings new

    def listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A new listing replaces everything seen before."""
        self._seen = {fields.key_of(item): item for item in items}

    def watched(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A watch event's claim: kept (ADDED, MODIFIED) or dropped (DELETED); its waiters woken."""
        key = fields.key_of(obj)
        if kind == "DELETED":
            self._seen.pop(key, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._seen[key] = obj
        if kind == "ADDED" and self.on_added is not None:
            self.on_added(obj)
        if (awaited := self._awaited.get(key)) is not None:
            awaited.set()

    def seen(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The claim's newest version the list and watch brought (None: none yet). It may lag the API
        server's: a write based on it carries its resourceVersion, so a stale one is refused, not
        applied."""
        return self._seen.get((namespace, name))

    async def seen_allocated(self, namespace: str, name: str, uid: str, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the watch brings the claim allocated: mode C lifts a pod's
        gate only then, so that kube-scheduler, whose watch of claims runs beside this one, sees the
        allocation rather than allocating the claim itself (and failing at PreBind, "allocated
        elsewhere in the meantime"). False when the time ran out."""
        key = (namespace, name)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            found = self._seen.get(key) or {}
            if claims.ref_of(found).uid == uid and (found.get("status") or {}).get("allocation"):
                return True
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            awaited = self._awaited.setdefault(key, asyncio.Event())
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(awaited.wait(), left)
            finally:
                if self._awaited.get(key) is awaited:
                    del self._awaited[key]
