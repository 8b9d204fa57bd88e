"""gpuledger's own node policy, ``default``.

It starts from FGD's fragmentation growth, but keeps the exact value instead of a 0..100 integer
(which turns most choices into coin flips), and breaks the remaining ties with best fit.
"""

from __future__ import annotations

from gpuledger_core.placement.ask import Ask
from gpuledger_core.placement.basic import MAX_SPEC_CPU, MAX_SPEC_GPU, cpu_free, gpu_taken
from gpuledger_core.placement.fgd import growth, sigmoid
from gpuledger_core.placement.frag import FragMeter, Workload
from gpuledger_core.placement.policy import Base, Option
from gpuledger_core.placement.state import NodeState


class Default(Base):
    name = "default"

    def __init__(self, workload: Workload) -> None:
        self.meter = FragMeter(workload)

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        found = growth(self.meter, node, ask)
        if found is None:
            return None
        grown, cards = found
        cpu_left = (cpu_free(node) - ask.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (node.gpu_room - gpu_taken(ask)) / MAX_SPEC_GPU
        fit = 1.0 - 0.5 * cpu_left - 0.5 * gpu_left
        return Option(float(int(sigmoid(-grown / 1000) * 100)) + 0.5 * fit, cards)
