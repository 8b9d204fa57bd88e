"""Placement's decisions over its view of the ledger: filter, prioritize, place, preferred.

Nothing here does I/O: every answer is computed from the view and from the pods filter has placed
whose bind has not reached the view yet (``assumed.py``), which count against their nodes. Per
node, answers are cached in the node's entry under the pod's shape (and the policy's generation
where the policy matters), so a node is only re-examined after its ledger, or the pods assumed on
it, changed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from random import Random
from typing import cast

from gpuledger_core.errors import Exhausted, NotFound, Unavailable
from gpuledger_core.ids import AllocationId
from gpuledger_core.model import Grant
from gpuledger_core.packing import (
    Ask,
    Guard,
    Policy,
    filter_nodes,
    rate,
    scale,
)
from gpuledger_core.pods import PodAsk, expand_models, impossible, plan, reserve_pod
from gpuledger_placement.assumed import Assumptions
from gpuledger_placement.hosts import HostUsage
from gpuledger_placement.mig_rates import mig_rate
from gpuledger_placement.numbering import Numbering, alone
from gpuledger_placement.policies import Policies, PolicyKey
from gpuledger_placement.preferred import preferred_ids
from gpuledger_placement.ranking import Ranking, Rankings
from gpuledger_placement.view import FleetView, NodeEntry

FITS, FAILED, UNRESOLVABLE = 0, 1, 2
RANKED = 8  # nodes a ``place`` answer names, best first, for a caller that loses a race
SHOWN_REASONS = 5
BUILD_STEP = 500  # nodes rated under a rebuilt policy per request, while the old one answers
BACKGROUND_STEP = 50  # ... per turn of the event loop, between requests (``build_rankings``)
Verdict = tuple[int, str]
STALE = "node inventory is stale (no heartbeat): nothing new is placed here until it reports"


@dataclass(frozen=True, slots=True)
class Filtered:
    fits: tuple[str, ...]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    passed_over: tuple[str, ...] = ()  # nodes that fit too but were not chosen (filter answers one)


@dataclass(frozen=True, slots=True)
class Placed:
    node: str
    grants: tuple[Grant, ...]
    ranked: tuple[str, ...]
    revision: int = 0  # the node's ledger revision judged; 0 when pods the scheduler assumed there count too


class PlacementService:
    def __init__(
        self,
        view: FleetView,
        policies: Policies,
        policy: str = "default",
        guard: Guard | None = None,
        ready: Callable[[], str] = lambda: "",
        rng: Random | None = None,
        assumed: Assumptions | None = None,
        hosts: HostUsage | None = None,
    ) -> None:
        self.view, self.policies, self.policy, self.guard = view, policies, policy, guard
        self.hosts = hosts  # each node's free CPU and memory, for the guard
        self.ready = ready
        self.rng = rng or Random()
        self.assumed = assumed if assumed is not None else Assumptions()
        self.numbering = Numbering()  # the memos' keys
        self._known: frozenset[str] = frozenset()
        self._expanded: dict[frozenset[str], frozenset[str]] = {}
        self.rankings = Rankings()
        # Nodes each request rates under a rebuilt policy; 0 where ``build_rankings`` runs
        # between requests (the service's own loop): then no request pays for a rebuild.
        self.build_step = BUILD_STEP
        view.watch(self.rankings.changed)

    def resolve(self, pod: PodAsk) -> PodAsk:
        """The pod with its model selectors (``A100|H100``) matched to the fleet's card models."""
        known = self.view.known_models()
        if known != self._known:
            self._known, self._expanded = known, {}

        def expanded(wanted: frozenset[str]) -> frozenset[str]:
            found = self._expanded.get(wanted)
            if found is None:
                found = self._expanded[wanted] = expand_models(wanted, known)
            return found

        return pod.with_models(expanded)

    def check(self) -> None:
        """Raise ``Unavailable`` when the view cannot be trusted (NATS away, not loaded yet)."""
        problem = self.ready()
        if problem:
            raise Unavailable(problem)

    # --- the extender's verbs ---

    def filter(self, pod: PodAsk, names: Sequence[str], caller: str = "") -> Filtered:
        """The extender's filter. For a pod that wants cards: the one node placement chooses among
        those it fits, assumed there until its bind (the others that fit are ``passed_over``), and
        why each other node does not fit. Every node passes a pod that wants none. ``caller``: who
        sent the pod (the assumption keeps it, ``assumed.py``)."""
        if not pod.wants_cards:  # every node will do, but a GPU node whose cards it would strand
            return self._guarded(pod, names)
        self.check()
        pod = self.resolve(pod)
        self.policies.observe(pod)
        self.assumed.expire()
        self.assumed.forget(pod.owner, "refiltered")  # its earlier choice must not stand in its way
        held = self._holding(pod, names)
        if held is not None:  # a retry of a bind that reserved and died: the pod goes to its room
            return Filtered((held,), {}, {}, tuple(name for name in names if name != held))
        judged = self._judged(pod, names)
        chosen = self._assume_best(pod, judged.fits, caller) if judged.fits else None
        if chosen is None:
            return judged
        others = tuple(name for name in judged.fits if name != chosen)
        return Filtered((chosen,), judged.failed, judged.unresolvable, others)

    def _guarded(self, pod: PodAsk, names: Sequence[str]) -> Filtered:
        """A pod that takes no card: every node that is not a GPU node, and each GPU node that
        is not stale and where it leaves the CPU and memory the guard keeps for the node's free cards.
        A pod with ResourceClaims is not guarded (its claims may be for cards, which DRA allocates
        and the ledger checks): only a stale GPU node fails it."""
        ask = Ask(None, pod.cpu_milli, pod.memory_mib, pod.owner.describe())
        now = self.view.clock()
        fits: list[str] = []
        failed: dict[str, str] = {}
        for name in names:
            why = self._cpu_only_problem(name, ask, now, guarded=not pod.claims)
            if why:
                failed[name] = why
            else:
                fits.append(name)
        return Filtered(tuple(fits), failed, {})

    def _cpu_only_problem(self, name: str, ask: Ask, now: float, guarded: bool = True) -> str:
        """Why a pod that takes no card may not go to node ``name`` ("" where it may)."""
        entry = self.view.entries.get(name)
        if entry is None:  # no cards here to strand
            return ""
        if self.view.stale_after_s and self.view.stale(name, now):
            return STALE
        if self.guard is None or self.hosts is None or not guarded:
            return ""
        free = self.hosts.free(name)
        if free is None:
            return "guard: gpuledger does not know this GPU node's CPU and memory yet"
        return self.guard.problem(replace(entry.state, cpu_free=free[0], mem_free=free[1]), ask)

    def _holding(self, pod: PodAsk, names: Sequence[str]) -> str | None:
        """The node among ``names`` where the pod already holds a live allocation of what it asks
        (a bind that reserved and then died, placement restarted, the scheduler retrying): the bind
        takes that allocation, so the node fits even when the pod's own room fills it."""
        node = self.view.holders.get(pod.owner.key)
        if node is None or node not in names:
            return None
        entry = self.view.entries.get(node)
        held = entry.ledger.of_owner(pod.owner.key) if entry is not None else None
        if held is None or held.requests != tuple(c.request for c in pod.containers):
            return None
        if self.view.stale_after_s and self.view.stale(node, self.view.clock()):
            return None
        return node

    def judge(self, pod: PodAsk, names: Sequence[str]) -> Filtered:
        """Every node's verdict for the pod, the assumed pods counted; nothing is chosen."""
        if not pod.wants_cards:
            return Filtered(tuple(names), {}, {})
        self.check()
        self.assumed.expire()
        return self._judged(self.resolve(pod), names)

    def _judged(self, pod: PodAsk, names: Sequence[str]) -> Filtered:
        fits: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for name, (code, why) in self._verdicts(pod, names):
            if code == FITS:
                fits.append(name)
            elif code == FAILED:
                failed[name] = why
            else:
                unresolvable[name] = why
        return Filtered(tuple(fits), failed, unresolvable)

    def current_policy(self) -> Policy:
        """The service's policy as built now (DRA mode C places claims with it)."""
        return self.policies.get(self.policy)[1]

    def _assume_best(self, pod: PodAsk, fits: Sequence[str], caller: str) -> str | None:
        """Choose the best of ``fits``, plan the pod there (cards and device IDs, beside the pods
        already assumed there) and assume it there; None if it could be planned on none."""
        key, policy = self.policies.get(pod.policy or self.policy)
        allocation_id = AllocationId(f"assumed-{pod.owner.key}")
        for name in self._ranked(pod, fits, key, policy):
            entry = self._entry(name)
            assert entry is not None
            try:
                after = reserve_pod(
                    entry.ledger,
                    pod,
                    policy,
                    allocation_id,
                    now=self.view.clock(),
                    lease_s=self.assumed.ttl_s,
                    slots_per_card=self.view.slots_per_card,
                    mix_isolation=self.view.mix_isolation,
                    chooser=self.policies.mig_chooser() if pod.mig else None,
                )
            except Exhausted:
                continue
            allocation = after.get(allocation_id)
            assert allocation is not None
            self.assumed.assume(allocation, pod, caller)
            return name
        return None

    def prioritize(self, pod: PodAsk, names: Sequence[str]) -> dict[str, int]:
        if not pod.wants_cards:
            return dict.fromkeys(names, 0)
        self.check()
        self.assumed.expire()
        pod = self.resolve(pod)
        key, policy = self.policies.get(pod.policy or self.policy)
        if not _from_ranking(pod, policy):
            return scale(self._rates(pod, names, key, policy))
        return scale(self._ranked_rates(pod, names, key, policy))

    # --- for the allocator (tools) and the plugin ---

    def place(self, pod: PodAsk, exclude: Collection[str] = ()) -> Placed:
        """The best node and every container's cards there, or ``Exhausted`` with reasons."""
        self.check()
        self.assumed.expire()
        pod = self.resolve(pod)
        key, policy = self.policies.get(pod.policy or self.policy)
        self.policies.observe(pod)
        if not _from_ranking(pod, policy):
            ranked = self._ranked(pod, [name for name in self.view.entries if name not in exclude], key, policy)
        else:
            ranked = self._best(pod, key, policy, exclude)
        for name in ranked:
            entry = self._entry(name)
            assert entry is not None
            try:
                revision = 0 if name in self.assumed.nodes else entry.revision
                return Placed(name, self._plan(entry, pod, policy), tuple(ranked), revision)
            except Exhausted:
                continue
        raise Exhausted(self._nowhere(pod, exclude))

    def best_nodes(self, pod: PodAsk, skip: Callable[[str], bool]) -> list[str]:
        """The first ``RANKED`` nodes of the view that may take ``pod``, best first under the
        service's policy, none that ``skip`` names: from the ranking classic pods of its shape are
        placed by, kept current as nodes change (mode C's claims, ``place_claim``'s ``preferred``).
        Empty where no ranking answers (a randomized policy, MIG, no container wanting cards)."""
        self.check()
        key, policy = self.policies.get(pod.policy or self.policy)
        return self._best(pod, key, policy, (), skip) if _from_ranking(pod, policy) else []

    def build_rankings(self, budget: int = BACKGROUND_STEP) -> bool:
        """Rate up to ``budget`` nodes of the rankings being built under a rebuilt policy; True
        while some are left (see ``Rankings.build``)."""
        return self.rankings.build(self.view.entries, self.view.order, budget)

    def drop_answers(self) -> None:
        """Forget every cached answer (the benchmark's cold runs)."""
        for entry in self.view.entries.values():
            entry.memo.clear()
        self.rankings.forget()
        self.assumed.drop_answers()

    def preferred(self, node: str, available: Collection[str], must_include: Collection[str], size: int) -> list[str]:
        """The best-connected ``size`` cards among the device IDs kubelet offers on ``node``."""
        self.check()
        entry = self.view.entries.get(node)
        if entry is None:
            raise NotFound(f"node {node} is not in the ledger")
        return preferred_ids(entry.ledger, available, must_include, size, self.policies.get("binpack")[1])

    # --- per node, cached per revision: the question is prepared once per call ---

    def _entry(self, name: str) -> NodeEntry | None:
        """The node's entry in the view, or the entry with its assumed pods counted if it has any."""
        entry = self.view.entries.get(name)
        if entry is None or name not in self.assumed.nodes:
            return entry
        return self._counted(name, entry)

    def _counted(self, name: str, entry: NodeEntry) -> NodeEntry:
        counted = self.assumed.entry(name, entry, self.view.slots_per_card, self.view.mix_isolation)
        return entry if counted is None else counted.entry

    def _ranked(self, pod: PodAsk, names: Iterable[str], key: PolicyKey, policy: Policy) -> list[str]:
        """The first ``RANKED`` nodes of ``names`` that fit, best first (any order if randomized)."""
        rates = self._rates(pod, names, key, policy)
        scored = [(-score, order, name) for order, (name, score) in enumerate(rates.items()) if score is not None]
        if not policy.randomized:
            return [name for *_, name in heapq.nsmallest(RANKED, scored)]
        ranked = [name for *_, name in scored]
        self.rng.shuffle(ranked)
        return ranked[:RANKED]

    def _best(
        self,
        pod: PodAsk,
        key: PolicyKey,
        policy: Policy,
        exclude: Collection[str],
        also: Callable[[str], bool] = lambda _: False,
    ) -> list[str]:
        """The first ``RANKED`` nodes of the view that fit, best first, none of ``exclude`` nor
        that ``also`` names: from the question's ranking for the nodes as the view has them, and
        rated afresh for the nodes that have pods assumed on them."""
        ranking = self._ranking(pod, key, policy)
        now, assumed = self.view.clock(), self.assumed.nodes
        stale = self.view.stale if self.view.stale_after_s else None

        def skip(name: str) -> bool:
            return name in exclude or name in assumed or (stale is not None and stale(name, now)) or also(name)

        found = [(-score, order, name) for score, order, name in ranking.best(RANKED, skip)]
        counted = [name for name in assumed if name not in exclude and name in self.view.entries and not also(name)]
        for name, score in self._rates(pod, counted, key, policy).items():
            if score is not None:
                found.append((-score, self.view.order.get(name, 0), name))
        return [name for *_, name in heapq.nsmallest(RANKED, found)]

    def _ranked_rates(
        self, pod: PodAsk, names: Sequence[str], key: PolicyKey, policy: Policy
    ) -> dict[str, float | None]:
        """``_rates`` from the question's ranking (nodes with assumed pods rated afresh)."""
        scores, assumed = self._ranking(pod, key, policy).scores, self.assumed.nodes
        now, stale = self.view.clock(), self.view.stale if self.view.stale_after_s else None
        found: dict[str, float | None] = {
            name: None if stale is not None and stale(name, now) else scores.get(name) for name in names
        }
        found.update(self._rates(pod, [name for name in names if name in assumed], key, policy))
        return found

    def _ranking(self, pod: PodAsk, key: PolicyKey, policy: Policy) -> Ranking:
        """The ranking of every node in the view for the pod's question."""
        main, single = pod.main(), pod.single()
        assert main is not None
        question = (key[0], single.shape if single is not None else pod.containers)

        def score(entry: NodeEntry) -> float | None:
            if single is None and self._pod_verdict(entry, pod, policy)[0] != FITS:
                return None
            return rate(entry.state, main, policy, self.guard)

        def make() -> Ranking:
            return Ranking(score, self.numbering.content if single is not None else alone)

        entries = self.view.entries
        return self.rankings.ranking(question, key, make, entries, entries, self.view.order, self.build_step)

    def _verdicts(self, pod: PodAsk, names: Iterable[str]) -> Iterator[tuple[str, Verdict]]:
        single = pod.single()
        if single is not None:
            key = self.numbering.question(("filter", single.shape))
            compute = partial(self._single_verdict, ask=single)
        else:
            policy_key, policy = self.policies.get(pod.policy or self.policy)
            key = self.numbering.question(("filter", policy_key, pod.containers))
            compute = partial(self._pod_verdict, pod=pod, policy=policy)
        now, entries, assumed, counted = self.view.clock(), self.view.entries, self.assumed.nodes, self._counted
        stale = self.view.stale if self.view.stale_after_s else None
        for name in names:
            entry = entries.get(name)
            if entry is not None and name in assumed:
                entry = counted(name, entry)
            if entry is None:
                yield name, (FAILED, self._absent(name))
            elif stale is not None and stale(name, now):
                yield name, (FAILED, STALE)
            else:
                found = entry.memo.get(key)
                if found is None:
                    found = self._counting_assumed(name, compute(entry))
                    entry.remember(key, found)
                yield name, cast(Verdict, found)

    def _absent(self, name: str) -> str:
        """Why a node the view has no entry for gets nothing."""
        why = self.view.unreadable.get(name)
        if why is not None:
            return f"its gpuledger ledger value cannot be read ({why}): nothing is placed here until it is readable"
        return "not in the gpuledger ledger: no inventory from this node yet"

    def _counting_assumed(self, name: str, verdict: Verdict) -> Verdict:
        """A node that is full counting the pods placed there and not bound yet says so."""
        pods = self.assumed.pods_on(name) if verdict[0] == FAILED else 0
        return (FAILED, f"{verdict[1]} (counting {pods} pod(s) placed here, being bound)") if pods else verdict

    def _single_verdict(self, entry: NodeEntry, ask: Ask) -> Verdict:
        never = impossible(entry.state, ask)
        if never:
            return UNRESOLVABLE, never
        fits, failed = filter_nodes([entry.state], ask, self.guard)
        return (FITS, "") if fits else (FAILED, failed[entry.state.name])

    def _pod_verdict(self, entry: NodeEntry, pod: PodAsk, policy: Policy) -> Verdict:
        for container in pod.containers:
            never = impossible(entry.state, pod.ask(container))
            if never:
                return UNRESOLVABLE, f"container {container.container}: {never}"
        try:
            self._plan(entry, pod, policy)
        except Exhausted as err:
            return FAILED, str(err).removeprefix(f"{entry.state.name}: ")
        return FITS, ""

    def _plan(self, entry: NodeEntry, pod: PodAsk, policy: Policy) -> tuple[Grant, ...]:
        view, chooser = self.view, self.policies.mig_chooser() if pod.mig else None
        spc, mix = view.slots_per_card, view.mix_isolation
        return plan(entry.ledger, pod, policy, slots_per_card=spc, mix_isolation=mix, chooser=chooser)

    def _rates(self, pod: PodAsk, names: Iterable[str], key: PolicyKey, policy: Policy) -> dict[str, float | None]:
        """The policy's raw score of each node (None: does not fit)."""
        main, single = pod.main(), pod.single()
        if main is None:
            return dict.fromkeys(names)
        memo_key = self.numbering.question(("rate", key, single.shape if single is not None else pod.containers))
        now, entries, assumed, counted = self.view.clock(), self.view.entries, self.assumed.nodes, self._counted
        mig = single is None and pod.mig
        stale = self.view.stale if self.view.stale_after_s else None
        found: dict[str, float | None] = {}
        for name in names:
            entry = entries.get(name)
            if entry is not None and name in assumed:
                entry = counted(name, entry)
            if entry is None or (stale is not None and stale(name, now)):
                found[name] = None
                continue
            known = entry.memo.get(memo_key, entry)
            if known is not entry:
                found[name] = cast(float | None, known)
                continue
            if mig:  # planned on the node's ledger, scored by what it takes of the MIG workload
                plan_ = partial(self._plan, entry, pod, policy)
                score = mig_rate(entry, pod, plan_, self.policies.mig_chooser(), self.guard)
            elif single is None and self._pod_verdict(entry, pod, policy)[0] != FITS:
                score = None
            else:
                score = rate(entry.state, main, policy, self.guard)
            entry.remember(memo_key, score)
            found[name] = score
        return found

    def _nowhere(self, pod: PodAsk, exclude: Collection[str]) -> str:
        names = [name for name in self.view.entries if name not in exclude]
        if not names:
            return f"{pod.owner.describe()}: the ledger has no nodes"
        reasons = [f"{name}: {why or 'lost to a concurrent change'}" for name, (_, why) in self._verdicts(pod, names)]
        more = len(reasons) - SHOWN_REASONS
        shown = "; ".join(reasons[:SHOWN_REASONS]) + (f"; and {more} more node(s)" if more > 0 else "")
        return f"{pod.owner.describe()} fits on no node: {shown}"


def _from_ranking(pod: PodAsk, policy: Policy) -> bool:
    """Whether the pod's nodes come from a question's ranking (``Rankings``): not for a randomized
    policy, a pod with MIG asks or none that wants cards (each node rated on its own then)."""
    return not policy.randomized and pod.main() is not None and not pod.mig
