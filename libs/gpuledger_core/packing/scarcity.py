"""How much of each card model the pods that may use only some models need, against the cluster's cards.

A typical pod that names models (``TypicalPod.models``) can use no other card. Spread over its
models in proportion to their cards, its share of the workload's GPU demand puts
``share / (cards of its models / all cards)`` on each of them. Summed over such pods, a model's
``pressure`` is the GPU its constrained pods want per card of it, relative to the workload's GPU
demand per card of the cluster: on the openb gpuspec33 trace 1.33 on T4 (the T4-only pods alone
want a third more than the T4 cards), 0.09 on G2. ``default`` adds, for each card an ask takes,
the milli it takes times how much more pressed that card's model is than the least pressed model
the ask may use: a pod that may go anywhere leaves the pressed models to the pods that need them,
and a pod with one choice pays nothing. Without pods that name models, or without the cluster's
cards per model, every pressure is 0 and the term counts nothing. See docs/placement.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuledger_core.packing.frag import Workload


@dataclass(frozen=True, slots=True)
class Scarcity:
    pressure: Mapping[str, float] = field(default_factory=dict)  # per model in the cluster

    @staticmethod
    def of(workload: Workload, supply: Mapping[str, int]) -> Scarcity:
        """The pressure on each model of ``supply`` (the cluster's cards per model)."""
        cards = sum(supply.values())
        demand = sum(w * pod.count * pod.milli for pod, w in workload.pods)
        if cards <= 0 or demand <= 0:
            return Scarcity()
        pressure = dict.fromkeys(supply, 0.0)
        for pod, w in workload.pods:
            held = sum(supply.get(model, 0) for model in pod.models)
            if not pod.count or held <= 0:
                continue  # no card wanted, any model will do, or none of its models is here
            per = (w * pod.count * pod.milli / demand) / (held / cards)
            for model in pod.models & pressure.keys():
                pressure[model] += per
        return Scarcity(pressure if any(pressure.values()) else {})

    def cost(self, models: Iterable[str], milli: int, allowed: frozenset[str]) -> float:
        """``milli`` times the excess pressure of each card's model in ``models`` (one entry per
        card taken) over the least pressed model here that ``allowed`` (empty: any) admits. A
        model the cluster's count did not include counts as the least pressed."""
        if not self.pressure:
            return 0.0
        eligible = [p for model, p in self.pressure.items() if not allowed or model in allowed]
        least = min(eligible, default=0.0)
        return milli * sum(self.pressure.get(model, least) - least for model in models)
