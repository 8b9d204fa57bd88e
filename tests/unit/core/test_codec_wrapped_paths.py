"""Field paths of errors raised inside a validated constructor (owner, request)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_core import codec
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.ledger import NodeLedger

from .builders import holding, ledger, share


def _stored() -> dict[str, Any]:
    raw = codec.ledger_to(NodeLedger(ledger(8000).node, (holding("a", share(0, 100, 10)),)))
    raw["allocations"][0]["requests"] = [{"count": 1, "mem_mib": 100}]
    return raw


@pytest.mark.parametrize(
    ("where", "key", "value", "field"),
    [
        ("owner", "kind", "robot", "allocations[0].owner.kind"),
        ("owner", "id", 7, "allocations[0].owner.id"),
        ("owner", "id", "", "allocations[0].owner.id"),
        ("request", "count", "two", "allocations[0].requests[0].count"),
        ("request", "models", ["P4", 4], "allocations[0].requests[0].models[1]"),
    ],
)
def test_the_path_is_named_once(where: str, key: str, value: object, field: str) -> None:
    raw = _stored()
    target = raw["allocations"][0]["owner"] if where == "owner" else raw["allocations"][0]["requests"][0]
    target[key] = value
    with pytest.raises(InvalidArgument) as caught:
        codec.ledger_from(raw)
    assert caught.value.field == field
