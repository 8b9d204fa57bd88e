"""A value in a node's key that cannot be read is that node's problem alone.

A node's plugin may write any bytes to its own key (docs/security.md). When a follower's watch or a
snapshot brings a value that does not decode, it is not applied and does not stop anything: the
follower hears that the node is unreadable (``Unreadable``: the node, the value's revision, what is
wrong), the key counts as arrived for the snapshot, and every other node is followed on. The node's
last readable value is not trusted any more: this process forgets it (the next write to the node
reads the key, and is refused saying what is wrong), and the allocator and placement place nothing
on the node until a readable value arrives (docs/ledger.md, "A value that cannot be read"). Each
bad value is logged once, naming the node, its revision and what is wrong, and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuledger_common.metrics import LEDGER_UNREADABLE
from gpuledger_common.store.known import Known
from gpuledger_core.errors import GpuledgerError
from gpuledger_core.ids import NodeName

log = logging.getLogger(__name__)
Unreadable = Callable[[NodeName, int, str], None]  # the node, the revision of its value, what is wrong


@dataclass(slots=True)
class BadValues:
    known: Known
    last: dict[str, int] = field(default_factory=dict)  # the revision of each node's last value that could not be read

    def noted(self, node: NodeName, revision: int, err: GpuledgerError) -> str:
        """What is wrong with the node's value at ``revision``: logged and counted the first time
        (a follower that starts again, or a snapshot, meets it again)."""
        why = str(err)
        self.known.forget(node)
        if self.last.get(node) != revision:
            self.last[node] = revision
            LEDGER_UNREADABLE.inc()
            log.error(
                "the ledger value of node %s (revision %d) cannot be read, so nothing new is placed on %s "
                "until it holds a readable one: %s",
                node,
                revision,
                node,
                why,
            )
        return why
