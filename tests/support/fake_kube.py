"""A fake of the inventory's ``NodeApi`` port: node labels in memory, JSON merge-patch semantics."""

from __future__ import annotations

import asyncio

from gpuledger_core.errors import NotFound


class FakeNodeApi:
    def __init__(self, labels: dict[str, dict[str, str]] | None = None) -> None:
        self.labels: dict[str, dict[str, str]] = labels or {}
        self.patches: list[tuple[str, dict[str, str | None]]] = []
        self.changed = asyncio.Event()

    async def get_labels(self, node: str) -> dict[str, str]:
        if node not in self.labels:
            raise NotFound(f"node {node} does not exist in Kubernetes")
        return dict(self.labels[node])

    async def patch_labels(self, node: str, patch: dict[str, str | None]) -> None:
        labels = self.labels.get(node)
        if labels is None:
            raise NotFound(f"node {node} does not exist in Kubernetes")
        self.patches.append((node, dict(patch)))
        for key, value in patch.items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        self.changed.set()

    async def close(self) -> None:
        return None
