"""gpuledger's own node policy, ``default``.

1. Fragmentation growth as FGD measures it, but against typical pods that carry their memory too
   (kube-scheduler checks node memory, so a node whose memory is gone strands its idle cards).
2. Plus ``balance_weight`` x the growth of the GPU that the node's CPU and memory would no longer
   serve in the workload's own proportions (``balance.Balance``): CPU-heavy pods go where CPU is
   plentiful instead of stranding the cards of CPU-poor nodes.
3. Plus ``scarcity_weight`` x, for each card taken, the milli taken times how much more the card's
   model is pressed by pods that may use only some models than the least pressed model the ask
   may use (``scarcity.Scarcity``, given the cluster's cards per model as ``supply``): a pod that
   may go anywhere leaves T4 cards to the T4-only pods. Nothing without ``supply`` or without
   such pods.
4. Scored in bands, ``int(sigmoid(-growth / 1000) * 50)`` (FGD's are 100): differences below about
   a tenth of a card do not decide; measured, the bands pack better than the exact value, which
   chases tiny differences caused by rare typical pods and spreads pods out.
5. Within a band: the caller's node order (the simulator's seeded order; ``best_fit_ties`` instead
   prefers the least CPU and GPU left after, which packs worse on every trace once 2. is in).

See docs/placement.md for the measurements behind each step, and what did not help.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuledger_core.packing.ask import Ask
from gpuledger_core.packing.balance import Balance
from gpuledger_core.packing.basic import MAX_SPEC_CPU, MAX_SPEC_GPU, cpu_free, gpu_taken
from gpuledger_core.packing.fgd import growth, sigmoid
from gpuledger_core.packing.frag import FragMeter, Workload
from gpuledger_core.packing.policy import Base, Option
from gpuledger_core.packing.scarcity import Scarcity
from gpuledger_core.packing.state import NodeState

BANDS = 50
BALANCE_WEIGHT = 2.0
SCARCITY_WEIGHT = 2.0


class Default(Base):
    name = "default"

    def __init__(
        self,
        workload: Workload,
        bands: int = BANDS,
        balance_weight: float = BALANCE_WEIGHT,
        best_fit_ties: bool = False,
        supply: Mapping[str, int] | None = None,
        scarcity_weight: float = SCARCITY_WEIGHT,
    ) -> None:
        self.meter = FragMeter(workload)
        self.bands = bands
        self.best_fit_ties = best_fit_ties
        self.balance = Balance.of(workload)
        self.balance_weight = balance_weight
        self.scarcity = Scarcity.of(workload, supply or {})
        self.scarcity_weight = scarcity_weight

    def evaluate(self, node: NodeState, ask: Ask) -> Option | None:
        found = growth(self.meter, node, ask)
        if found is None:
            return None
        grown, cards = found
        if self.balance_weight:
            grown += self.balance_weight * self.balance.growth(
                node.gpu_room, node.cpu_free, node.mem_free, gpu_taken(ask), ask.cpu_milli, ask.memory_mib
            )
        if self.scarcity_weight and cards:
            models = (node.cards[pos].model for pos in cards)
            grown += self.scarcity_weight * self.scarcity.cost(models, gpu_taken(ask) // len(cards), ask.models)
        band = float(int(sigmoid(-grown / 1000) * self.bands))
        if not self.best_fit_ties:
            return Option(band, cards)
        cpu_left = (cpu_free(node) - ask.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (node.gpu_room - gpu_taken(ask)) / MAX_SPEC_GPU
        fit = 1.0 - 0.5 * cpu_left - 0.5 * gpu_left  # 0..1, fuller is higher
        return Option(band + 0.5 * fit, cards)
