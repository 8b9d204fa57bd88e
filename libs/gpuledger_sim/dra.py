"""The trace replay through DRA mode C's allocation path (docs/dra-mode-c.md): each pod that wants
cards becomes a ResourceClaim, allocated as placement's claim allocator allocates one.

The claim is what a user writes against the shipped DeviceClass ``gpu.gpuledger.io``
(deploy/kubernetes/dra/deviceclass.yaml): one ``exactly`` request of ``num_gpu`` cards. A pod of
whole cards asks no capacity; a fractional pod asks ``compute`` = its percent of a card (a share
that is no whole percent is rounded up; the openb traces have none) and the smallest memory the
slices' grid allows, one ``MEMORY_STEP_MIB`` step. That memory is a modelling choice: the trace
carries no GPU memory, and DRA cannot ask compute without memory (the capacity's default is all of
it). One step keeps compute, the one dimension the trace has, the one that decides, as in the
classic replay: a card (``CARD_MEMORY_MIB`` here, every model alike) holds 64 such steps, more
sharers than the trace's smallest share (5 %) lets on it.

Each claim goes the claim allocator's way (``ClaimAllocator._allocate``): ``claim_ask``;
``place_claim`` over every node's ledger for the node, with the pod's CPU and memory and each
node's state with its host's (the allocator's view), the pod's host fit checked by the host rule
(the allocator's ``host``); ``place_claim`` again on that node's ledger alone, as the allocator's
compare-and-set ``transition`` plans the cards; the allocation written as kube-scheduler writes it
(``allocation_status``), read back (``claims.results_of``, ``claims.ledger_allocation``) and
reserved in the node's ledger (the transition's steps for an entry the claim holds already never
apply: every claim is new, and nothing is released). Cards are shareable and their slots not
counted (the classic replay lets as many sharers on a card as its compute takes).

The ledger's nodes are named ``<position>-<trace name>``, position in the tie-break order, so that
``place_claim``'s tie-break (the smallest name) is the classic replay's (the first in that order),
as the FGD simulator prefixes its names; attempts report the trace's own names.

Pods that want no card have no claim: kube-scheduler places them. The replay places them as the
classic replay does (its ``NodeChooser``, over the nodes as the ledgers and the hosts leave them),
so that the two paths differ only in the claims. A pod with model constraints (``gpu_spec``) would
need a CEL selector in its claim, which mode C leaves to kube-scheduler: such a trace is refused.
A randomized policy (``random``) takes the first best node here: the replay gives ``place_claim``
no ``rng`` to draw from (placement does).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuledger_core import claims
from gpuledger_core.claim_asks import claim_ask
from gpuledger_core.claim_placement import ClaimPlan, Host, place_claim
from gpuledger_core.claim_status import allocation_status
from gpuledger_core.claims import MEMORY_STEP_MIB
from gpuledger_core.errors import Exhausted, InvalidArgument
from gpuledger_core.ids import AllocationId, CardUuid, NodeName
from gpuledger_core.ledger import NodeLedger, reserve
from gpuledger_core.model import Allocation, Card, Node
from gpuledger_core.packing import Ask, NodeChooser, NodeState, Policy, from_ledger, make_policy
from gpuledger_core.packing.fit import problem
from gpuledger_core.packing.state import charge
from gpuledger_sim.replay import (
    Attempt,
    Config,
    Summary,
    Tally,
    ask_of,
    drive,
    guard_for,
    prepare,
    supply_of,
)
from gpuledger_sim.trace import WHOLE, TraceNode, TracePod

DRIVER = "gpu.gpuledger.io"
DEVICE_CLASS: dict[str, Any] = {  # as deploy/kubernetes/dra/deviceclass.yaml ships it
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.gpuledger.io"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "gpu.gpuledger.io" && '
                    '!has(device.attributes["gpu.gpuledger.io"].profile) && '
                    'device.attributes["gpu.gpuledger.io"].tenancy != "mps"'
                }
            }
        ]
    },
}
CLASSES = {DEVICE_CLASS["metadata"]["name"]: DEVICE_CLASS}
CARD_MEMORY_MIB = 16 * 1024
REQUEST = "gpu"
NAMESPACE = "sim"
PLANNED = AllocationId("c-planned")
NOW = 0.0


@dataclass(frozen=True, slots=True)
class Allocated:
    """A claim allocated: the plan, the ``status.allocation`` written, and the ledger allocation
    read back from it (what is reserved)."""

    plan: ClaimPlan
    status: dict[str, Any]
    allocation: Allocation


def claim_of(pod: TracePod) -> dict[str, Any]:
    """The ResourceClaim a user writes for ``pod``'s cards (see the module's note on memory)."""
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS["metadata"]["name"], "count": pod.num_gpu}
    if pod.gpu_milli < WHOLE:
        percent = f"{pod.gpu_milli * 100 / WHOLE:g}"
        exactly["capacity"] = {"requests": {"memory": f"{MEMORY_STEP_MIB}Mi", "compute": percent}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": NAMESPACE, "name": pod.name, "uid": pod.name},
        "spec": {"devices": {"requests": [{"name": REQUEST, "exactly": exactly}]}},
    }


def allocate(claim: dict[str, Any], ledgers: Sequence[NodeLedger], policy: Policy, pod: Pod) -> Allocated:
    """The claim of ``pod`` allocated as the claim allocator allocates it: the node chosen, then
    its ``transition``; ``Exhausted`` when it fits nowhere."""
    ask = claim_ask(claim, CLASSES, DRIVER, MEMORY_STEP_MIB)
    if ask is None:
        raise InvalidArgument("spec.devices.requests", f"{claims.ref_of(claim).describe()} asks for no class of ours")
    chosen = place_claim(
        ledgers, ask, policy, PLANNED, NOW, slots_per_card=None, host=pod.host, cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib, state=pod.state,
    )  # fmt: skip
    ledger = next(ledger for ledger in ledgers if ledger.node.name == chosen.allocation.node)
    plan = place_claim([ledger], ask, policy, PLANNED, NOW, slots_per_card=None)
    node = ledger.node
    status = allocation_status(
        plan.allocation, node, DRIVER, NOW, shareable=True, chosen=plan.chosen, share_id=_share_ids(ask.ref.uid)
    )
    written = {"metadata": claim["metadata"], "status": {"allocation": status}}
    devices = claims.results_of(written, DRIVER)
    allocation = claims.ledger_allocation(ask.ref, devices, node, NOW, MEMORY_STEP_MIB, ask.isolation)
    return Allocated(plan, status, allocation)


@dataclass(frozen=True, slots=True)
class Pod:
    """What the claim allocator knows of the claim's pod and the nodes' hosts."""

    cpu_milli: int
    memory_mib: int
    host: Host  # why the pod cannot run on a node's host; empty: it can
    state: Callable[[NodeLedger], NodeState]  # the node's state, with its host's free CPU and memory


def _share_ids(uid: str) -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"{uid}-{next(counter)}"


def refuse_models(pods: Sequence[TracePod]) -> None:
    """``InvalidArgument`` naming the first pod that wants cards of given models."""
    pod = next((p for p in pods if p.num_gpu and p.models), None)
    if pod is not None:
        why = (
            f"pod {pod.name} asks for card models {pod.gpu_spec}: its claim would need a CEL selector, "
            "which DRA mode C leaves to kube-scheduler; replay this trace with --path classic"
        )
        raise InvalidArgument("gpu_spec", why)


def ledger_of(node: TraceNode, position: int, width: int) -> NodeLedger:
    """An empty ledger of the trace node, named after its ``position`` in the tie-break order."""
    name = NodeName(f"{position:0{width}d}-{node.name}")
    cards = tuple(Card(CardUuid(f"{name}/{i}"), i, node.model, CARD_MEMORY_MIB) for i in range(node.gpus))
    return NodeLedger(Node(name, cards, cpu_milli=node.cpu_milli, memory_mib=node.memory_mib))


@dataclass(slots=True)
class _Cluster:
    """The nodes in tie-break order: their ledgers (the cards), and their states (the ledger's
    cards, the host's CPU and memory) that the claims are scored on, as the allocator's view
    holds them, and the chooser of card-less pods and the tally read."""

    ledgers: list[NodeLedger]
    chooser: NodeChooser
    tally: Tally
    on_allocated: Callable[[Allocated], None] | None = None
    position: dict[NodeName, int] = field(init=False)

    def __post_init__(self) -> None:
        self.position = {ledger.node.name: i for i, ledger in enumerate(self.ledgers)}

    def place(self, pod: TracePod) -> tuple[int, tuple[int, ...]] | None:
        ask = ask_of(pod)
        if not pod.num_gpu:
            found = self.chooser.choose(ask)
            return None if found is None else self._charge(found[0], ask, ())
        try:
            done = allocate(claim_of(pod), self.ledgers, self.chooser.policy, self._pod(ask))
        except Exhausted:
            return None
        if self.on_allocated is not None:
            self.on_allocated(done)
        at = self.position[done.allocation.node]
        self.ledgers[at] = reserve(self.ledgers[at], done.allocation)
        return self._charge(at, ask, tuple(share.index for share in done.allocation.shares()))

    def _charge(self, at: int, ask: Ask, cards: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """The host charged with the pod, as the classic replay charges it; the cards as the ledger
        holds them."""
        after = charge(self.chooser.nodes[at], ask.cpu_milli, ask.memory_mib)
        if cards:
            after = replace(after, cards=from_ledger(self.ledgers[at]).cards)
        self.chooser.update(at, after)
        self.tally.changed(at, after)
        return at, cards

    def _pod(self, ask: Ask) -> Pod:
        on_host = Ask(None, ask.cpu_milli, ask.memory_mib, ask.name)
        return Pod(
            ask.cpu_milli,
            ask.memory_mib,
            lambda node: problem(self.chooser.nodes[self.position[node]], on_host),
            lambda ledger: self.chooser.nodes[self.position[ledger.node.name]],
        )


def replay_dra(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    config: Config,
    on_attempt: Callable[[Attempt], None] | None = None,
    on_allocated: Callable[[Allocated], None] | None = None,
) -> Summary:
    """The replay of ``gpuledger_sim.replay`` with every claim allocated through DRA mode C's path."""
    refuse_models(pods)
    started = time.perf_counter()
    setting = prepare(nodes, pods, config)
    width = len(str(max(len(setting.nodes) - 1, 0)))
    ledgers = [ledger_of(n, i, width) for i, n in enumerate(setting.nodes)]
    states = [
        from_ledger(ledger, cpu_free=n.cpu_milli, mem_free=n.memory_mib)
        for ledger, n in zip(ledgers, setting.nodes, strict=True)
    ]
    policy = make_policy(config.policy, setting.typical, supply_of(setting.nodes))
    chooser = NodeChooser(states, policy, guard_for(config, setting.typical), setting.rng)
    tally = Tally.of(config, setting, states, "dra")
    cluster = _Cluster(ledgers, chooser, tally, on_allocated)
    drive(setting, tally, cluster.place, on_attempt)
    return tally.finish(time.perf_counter() - started)
