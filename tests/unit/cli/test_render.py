"""What ``gpuledger inspect`` prints: a node whose ledger value cannot be read, a holder over its grant."""

from __future__ import annotations

import time
from dataclasses import replace

from gpuledger_common import render
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.model import AllocState, Owner, OwnerKind
from gpuledger_core.status import Holder, NodeStatus


def test_a_node_whose_ledger_value_cannot_be_read_is_listed_with_why() -> None:
    text = render.cluster([NodeStatus(NodeName("bad-0"), (), unreadable="ledger value: not valid JSON")])
    assert "bad-0 (unreadable: ledger value: not valid JSON)" in text.splitlines()[1]
    assert text.endswith("1 node(s), 0 card(s), 0 in use")


def test_a_holder_shows_what_it_uses_and_a_mark_when_over_its_grant() -> None:
    owner = Owner(OwnerKind.POD, "uid-1", "team-a", "train")
    held = Holder(AllocationId("a1"), owner, "main", 4096, 250, False, AllocState.BOUND, time.time())
    assert render.holder(held).startswith("team-a/train[main] (4096 MiB, 25%, bound, ")  # not measured
    assert "(4096 MiB, 25%, uses 1000 MiB, bound, " in render.holder(replace(held, used_mib=1000))
    over = render.holder(replace(held, used_mib=5000, over=True))
    assert "(4096 MiB, 25%, uses 5000 MiB OVER GRANT, bound, " in over
    busy = render.holder(replace(held, used_mib=1000, used_core_milli=375))
    assert "(4096 MiB, 25%, uses 1000 MiB and 37.5% of the SMs, bound, " in busy
