"""gpuledger's own node policy, ``default``.

1. Fragmentation growth as FGD measures it, but against typical pods that carry their memory too
   (kube-scheduler checks node memory, so a node whose memory is gone strands its idle cards).
2. Scored in bands like FGD's ``int(sigmoid(-growth / 1000) * 100)``: differences far below one card
   do not decide; measured, the bands pack better than the exact value, which chases tiny
   differences caused by rare typical pods and spreads pods out.
3. Within a band: best fit (the least CPU and GPU left after), then the caller's node order.

See docs/placement.md for the measurements behind each step, and what did not help.
"""

from __future__ import annotations

from gpuledger_core.placement.ask import Ask
from gpuledger_core.placement.basic import MAX_SPEC_CPU, MAX_SPEC_GPU, cpu_free, gpu_taken
from gpuledger_core.placement.fgd import growth, sigmoid
from gpuledger_core.placement.frag import FragMeter, Workload
from gpuledger_core.placement.policy import Base, Option
from gpuledger_core.placement.state import NodeState

BANDS = 100


class Default(Base):
    name = "default"

    def __init__(self, workload: Workload, bands: int = BANDS) -> None:
        self.meter = FragMeter(workload)
        self.bands = bands

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        found = growth(self.meter, node, ask)
        if found is None:
            return None
        grown, cards = found
        band = float(int(sigmoid(-grown / 1000) * self.bands))
        cpu_left = (cpu_free(node) - ask.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (node.gpu_room - gpu_taken(ask)) / MAX_SPEC_GPU
        fit = 1.0 - 0.5 * cpu_left - 0.5 * gpu_left  # 0..1, fuller is higher
        return Option(band + 0.5 * fit, cards)
