"""Identifier types: distinct names for the strings that identify things."""

from __future__ import annotations

from typing import NewType

CardUuid = NewType("CardUuid", str)
NodeName = NewType("NodeName", str)
AllocationId = NewType("AllocationId", str)
PodUid = NewType("PodUid", str)
