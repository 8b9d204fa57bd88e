"""What ``gpuledger inspect`` prints for a node whose ledger value cannot be read."""

from __future__ import annotations

from gpuledger_common import render
from gpuledger_core.ids import NodeName
from gpuledger_core.status import NodeStatus


def test_a_node_whose_ledger_value_cannot_be_read_is_listed_with_why() -> None:
    text = render.cluster([NodeStatus(NodeName("bad-0"), (), unreadable="ledger value: not valid JSON")])
    assert "bad-0 (unreadable: ledger value: not valid JSON)" in text.splitlines()[1]
    assert text.endswith("1 node(s), 0 card(s), 0 in use")
