"""The store writes a node's value in the schema its cards need (``codec.node_schema``): 2 for a
node with a card in MIG mode, which a replica that knows only schema 1 must not write over, and
1, byte for byte as ``codec.ledger_to`` spells it, for every other node."""

from __future__ import annotations

from dataclasses import replace

import orjson

from gpuledger_common.store.values import Values
from gpuledger_core import codec
from gpuledger_core.ledger import NodeLedger, reserve, set_mode
from gpuledger_core.mig import share_of
from gpuledger_core.mig_profiles import A100_40GB
from gpuledger_core.model import CardMode

from ..core.builders import card, holding, node

A100 = "NVIDIA A100-SXM4-40GB"


def _ledgers() -> tuple[NodeLedger, NodeLedger]:
    plain = NodeLedger(replace(node(40960, 40960), cards=(card(0, 40960, model=A100), card(1, 40960, model=A100))))
    mig = set_mode(plain, plain.node.cards[0].uuid, CardMode.MIG)
    profile = A100_40GB.by_name("3g.20gb")
    assert profile is not None
    return plain, reserve(mig, holding("a", share_of(mig.node.cards[0], profile, 4)))


def test_a_node_with_a_mig_card_is_written_in_schema_2_and_read_back() -> None:
    _, mig = _ledgers()
    values = Values()
    data = values.encoded(mig)
    assert data.startswith(b'{"schema":2,')
    assert data == orjson.dumps(codec.ledger_to(mig))
    assert Values().decoded("node-a", data) == mig
    assert values.decoded("node-a", data) == mig


def test_a_node_without_one_is_written_in_schema_1_as_before() -> None:
    plain, mig = _ledgers()
    values = Values()
    values.encoded(mig)  # the same node, in MIG mode, then not: the inventory's schema follows
    data = values.encoded(plain)
    assert data.startswith(b'{"schema":1,') and b'"mig"' not in data and b'"mode"' not in data
    assert data == orjson.dumps(codec.ledger_to(plain))
    assert Values().decoded("node-a", data) == plain
