"""Where a ResourceClaim goes (pure): the node and cards for a ``ClaimAsk`` on the ledger, by the
policy code of a classic pod (DRA mode C, docs/dra-mode-c.md).

The claim is planned as a pod whose containers are the claim's requests (``pods.plan``: the same
per-card fit, slots and isolation tiers) and whose CPU and memory are its pod's, on every node whose
host the caller accepts (its CPU, memory, taints: ``host``), and the node is chosen by the policy's
score of the request that wants the most cards, as the extender scores a pod's nodes: on the node's
state with its host's free CPU and memory where the caller knows them (``state``: the policies
weigh them, as the balance term and bestfit's CPU left do), the name breaking ties. Nodes are
scored first and planned best first until one takes the whole claim: the same choice as planning
every node and taking the best, with one plan where the best node fits. A
``firstAvailable`` request tries its subrequests in order: the first combination that fits
somewhere wins. Requests linked by an NVLink ``matchAttribute`` get cards in one of the node's
NVLink groups of that size, the attribute's value (``pods.plan``: the policy's plan if it
keeps them, else its plan inside each group); a node where no group takes them is passed over.

A claim with MIG requests (``Request.mig``, the MIG DeviceClass) is planned on every node its host
allows, its instances chosen by ``mig_fit.fit_mig`` (``chooser``), and the node whose plan scores
best by ``mig_fit.mig_score`` (what it takes of the recent MIG workload) is taken, the name breaking
ties; the share policies' score does not weigh its other requests then.

The result is the claim's allocation as the ledger will hold it (owned by the claim, one grant
per request, committed: the claim says so once written), on the slices' grid.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from random import Random

from gpuledger_core.claim_asks import ClaimAsk
from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.mig_fit import mig_score
from gpuledger_core.mig_place import MigChooser
from gpuledger_core.model import Allocation, AllocState, Grant, Request
from gpuledger_core.packing import NodeState, Policy, from_ledger, rate
from gpuledger_core.pods import PodAsk, plan

Host = Callable[[NodeName], str]  # why the claim's pod cannot run on the node's host; empty: it can
Preferred = Callable[[PodAsk, Callable[[str], bool]], Sequence[str]]  # best nodes first, none the 2nd names


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    allocation: Allocation
    chosen: dict[str, str]  # request -> the result's request name (``main/sub`` for a firstAvailable choice)


def place_claim(
    ledgers: Sequence[NodeLedger],
    ask: ClaimAsk,
    policy: Policy,
    allocation_id: AllocationId,
    now: float,
    *,
    slots_per_card: int | None,
    host: Host = lambda _: "",
    mix_isolation: bool = False,
    cpu_milli: int = 0,
    memory_mib: int = 0,
    state: Callable[[NodeLedger], NodeState] | None = None,
    chooser: MigChooser | None = None,
    preferred: Preferred | None = None,
    rng: Random | None = None,
) -> ClaimPlan:
    """The claim's allocation on the best node, or ``Exhausted`` naming why each node was not.
    ``preferred``: the best nodes for an ask, from a ranking kept by the caller (placement's, the
    one classic pods of the shape are placed by); they are planned first, and every node is
    scored only where none of them takes the claim. ``rng`` serves a randomized policy: any node
    that takes the claim, uniformly, as classic pods get (``packing.pick``); without it, the
    first by name."""
    chooser = chooser or MigChooser()
    reasons: dict[str, str] = {}
    by_name = {str(ledger.node.name): ledger for ledger in ledgers} if preferred is not None else {}
    for combo in itertools.product(*(range(len(r.choices)) for r in ask.requests)):
        picked = [r.choices[i] for r, i in zip(ask.requests, combo, strict=True)]
        pod = _as_pod(ask, [request for _, request in picked], cpu_milli, memory_mib)
        main = pod.main()
        if preferred is not None and not pod.mig:
            for name in preferred(pod, lambda n: n not in by_name or bool(host(NodeName(n)))):
                with contextlib.suppress(Exhausted):
                    grants = plan(by_name[name], pod, policy, slots_per_card=slots_per_card,
                                  mix_isolation=mix_isolation, chooser=chooser)  # fmt: skip
                    return _claim_plan(ask, picked, by_name[name], grants, allocation_id, now)
        ranked: list[tuple[float, str, NodeLedger]] = []
        for ledger in ledgers:  # scored first (cheap on the caller's states), planned best first
            name = str(ledger.node.name)
            why = host(ledger.node.name)
            if why:
                reasons[name] = why
                continue
            scored = (
                state(ledger)
                if state is not None
                else from_ledger(ledger, slots_per_card=slots_per_card, mix_isolation=mix_isolation)
            )
            ranked.append((-((rate(scored, main, policy) if main is not None else None) or 0.0), name, ledger))
        best: tuple[NodeLedger, tuple[Grant, ...]] | None = None
        best_mig = float("-inf")
        order = sorted(ranked, key=lambda r: (r[0], r[1]))
        if policy.randomized and rng is not None and not pod.mig:
            rng.shuffle(order)  # the first that takes it, of a uniform order: any node that fits, alike
        for _, name, ledger in order:
            try:
                grants = plan(
                    ledger, pod, policy, slots_per_card=slots_per_card, mix_isolation=mix_isolation, chooser=chooser
                )
            except Exhausted as err:
                reasons[name] = str(err).removeprefix(f"{name}: ")
                continue
            if not pod.mig:
                best = (ledger, grants)
                break
            score = mig_score(ledger, [s for g in grants for s in g.cards if s.mig is not None], chooser)
            if score > best_mig:  # every node planned; the first (by name) of the best scores kept
                best, best_mig = (ledger, grants), score
        if best is not None:
            return _claim_plan(ask, picked, *best, allocation_id, now)
    shown = "; ".join(f"{node}: {why}" for node, why in sorted(reasons.items())[:5]) or "no node"
    raise Exhausted(f"{ask.ref.describe()} fits on no node: {shown}")


def _claim_plan(
    ask: ClaimAsk,
    picked: Sequence[tuple[str, Request]],
    ledger: NodeLedger,
    grants: tuple[Grant, ...],
    allocation_id: AllocationId,
    now: float,
) -> ClaimPlan:
    chosen = {r.name: result for r, (result, _) in zip(ask.requests, picked, strict=True)}
    requests = tuple(request for _, request in picked)
    allocation = Allocation(
        allocation_id, ask.ref.owner, ledger.node.name, grants, AllocState.BOUND,
        isolation=ask.isolation, created_at=now, updated_at=now, requests=requests,
    )  # fmt: skip
    return ClaimPlan(allocation, chosen)


PREEMPT_CHOICES = 8  # the combinations of a claim's ``firstAvailable`` choices preemption looks at


def claim_as_pod(ask: ClaimAsk, cpu_milli: int = 0, memory_mib: int = 0) -> PodAsk:
    """The claim planned as a pod (its owner the claim), each request at its first choice."""
    return _as_pod(ask, [r.choices[0][1] for r in ask.requests], cpu_milli, memory_mib)


def claim_as_pods(ask: ClaimAsk, cpu_milli: int = 0, memory_mib: int = 0) -> list[PodAsk]:
    """The claim planned as a pod for each combination of its requests' choices, in the order
    ``place_claim`` tries them (the first ``PREEMPT_CHOICES``): what preemption makes room for, the
    first it can (a ``firstAvailable`` request's later subrequests too)."""
    combos = itertools.islice(itertools.product(*(r.choices for r in ask.requests)), PREEMPT_CHOICES)
    return [_as_pod(ask, [request for _, request in picked], cpu_milli, memory_mib) for picked in combos]


def _as_pod(ask: ClaimAsk, requests: Sequence[Request], cpu_milli: int, memory_mib: int) -> PodAsk:
    containers = tuple(ContainerAsk(r.name, request) for r, request in zip(ask.requests, requests, strict=True))
    return PodAsk(
        ask.ref.owner, containers, ask.isolation, cpu_milli=cpu_milli, memory_mib=memory_mib, linked=ask.linked
    )
