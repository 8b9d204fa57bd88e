"""A MIG pod's score of a node for the extender: what its planned instances cost the recent MIG
workload (``mig_fit.mig_score``: the layout that keeps the most for the workload scores highest).

A pod with MIG asks is planned on the node's ledger (``pods.plan``, its instances chosen by
``mig_fit.fit_mig``), so its score is the plan's, not a share policy's; the node must have the
pod's CPU and memory free as for any pod (``packing.fit.host_problem``).
"""

from __future__ import annotations

from collections.abc import Callable

from gpuledger_core.errors import Exhausted
from gpuledger_core.mig_fit import mig_score
from gpuledger_core.mig_place import MigChooser
from gpuledger_core.model import Grant
from gpuledger_core.packing import Guard
from gpuledger_core.packing.fit import host_problem
from gpuledger_core.pods import PodAsk
from gpuledger_placement.view import NodeEntry


def mig_rate(
    entry: NodeEntry, pod: PodAsk, plan: Callable[[], tuple[Grant, ...]], chooser: MigChooser, guard: Guard | None
) -> float | None:
    """The pod's score of ``entry``'s node (higher is better); None where it does not fit."""
    main = pod.main()
    if main is not None and host_problem(entry.state, main, guard):
        return None
    try:
        grants = plan()
    except Exhausted:
        return None
    return mig_score(entry.ledger, [share for grant in grants for share in grant.cards], chooser)
