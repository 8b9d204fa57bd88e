"""The ledger-versus-pods check the e2e and fault tests run also finds a card whose holders are of
both isolation tiers (unless the run allows mixing)."""

from __future__ import annotations

from dataclasses import replace

from gpuledger_core.ledger import reserve
from gpuledger_core.model import Grant, Isolation
from tests.support.ledger_check import check

from ..core.builders import allocation, ledger, share


def test_a_card_of_both_tiers_is_a_finding_unless_mixing_is_allowed() -> None:
    node = ledger(8000)
    for name, tier in (("m", Isolation.MPS), ("n", Isolation.NONE)):
        held = replace(allocation(name, Grant("main", (share(0, 1000, 100),)), lease=1e12), isolation=tier)
        node = reserve(node, held, mix_isolation=True)
    findings = check([node], [], 8, now=0).findings
    assert "node-a card 0: holders of isolation mps and none share it" in findings
    assert not [f for f in check([node], [], 8, now=0, mix_isolation=True).findings if "isolation" in f]
