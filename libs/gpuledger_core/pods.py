"""A pod as the ledger and placement see it, and its cards on one node. Pure: no I/O.

A pod asks for cards per container. Placement works on one ``Ask`` at a time; this module turns a
pod into asks, plans every container's cards on a node (init containers each alone on the node as it
is, app containers one after another, as ``usage.allocation_use`` counts them) and builds the one
ledger transition that reserves them with their kubelet device IDs.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from gpuledger_core.errors import Exhausted
from gpuledger_core.fit import ContainerAsk, card_states, share_for
from gpuledger_core.ids import AllocationId
from gpuledger_core.ledger import NodeLedger, reservation, reserve
from gpuledger_core.mig_fit import fit_mig, mig_impossible
from gpuledger_core.mig_place import MigChooser
from gpuledger_core.model import Allocation, Grant, Isolation, Node, Owner, OwnerKind, Request
from gpuledger_core.nvlink import Linked, group_cards, unlinked
from gpuledger_core.packing import Ask, Decision, NodeState, Policy, from_ledger, place, shares
from gpuledger_core.packing.state import UNTRACKED
from gpuledger_core.slots import assign_device_ids, slot_problem

Hint = tuple[tuple[int, ...], ...]  # card indexes per container, in the pod's container order
LINKED_TRIES = 16  # combinations of NVLink groups a pod with constraints is planned in
FENCE = Owner(OwnerKind.TOOL, "-nvlink-fence-")  # holds the cards a linked plan may not take


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What a pod asks of gpuledger. ``containers`` holds only the containers that want cards, init
    containers first, each group in spec order (the order kubelet admits them in)."""

    owner: Owner
    containers: tuple[ContainerAsk, ...] = ()
    isolation: Isolation = Isolation.NONE
    policy: str = ""  # the pod's own policy (annotation), empty for the service's
    cpu_milli: int = 0
    memory_mib: int = 0
    claims: bool = False  # the pod asks for devices through ResourceClaims (DRA decides those)
    linked: tuple[Linked, ...] = ()  # containers whose cards must all be in one NVLink group (a claim's)

    @property
    def wants_cards(self) -> bool:
        return bool(self.containers)

    def ask(self, container: ContainerAsk) -> Ask:
        return Ask(container.request, self.cpu_milli, self.memory_mib, self.owner.describe(), self.isolation)

    def single(self) -> Ask | None:
        """The one ask when one app container wants cards and no init container does (the usual
        pod): placement can then work on cached node states. ``None`` otherwise, and for a MIG
        ask (its instances are planned on the node's ledger, ``mig_fit``)."""
        if len(self.containers) != 1 or self.containers[0].init or self.containers[0].request.mig:
            return None
        return self.ask(self.containers[0])

    @property
    def mig(self) -> bool:
        """Whether a container asks for MIG instances."""
        return any(c.request.mig for c in self.containers)

    def with_models(self, resolve: Callable[[frozenset[str]], frozenset[str]]) -> PodAsk:
        """The pod with every container's model selector passed through ``resolve``."""
        if not any(c.request.models for c in self.containers):
            return self
        containers = tuple(
            replace(c, request=replace(c.request, models=resolve(c.request.models))) for c in self.containers
        )
        return replace(self, containers=containers)

    def unlinked(self, node: Node, grants: Iterable[Grant]) -> str:
        """Why the cards ``grants`` give containers that must be in one NVLink group (``linked``)
        are not; empty when they are."""
        return unlinked(node, self.linked, grants)

    def main(self) -> Ask | None:
        """The ask a node is scored by: the app container that wants the most cards."""
        apps = [c for c in self.containers if not c.init] or list(self.containers)
        if not apps:
            return None
        return self.ask(max(apps, key=lambda c: c.request.count))


def expand_models(wanted: frozenset[str], known: Iterable[str]) -> frozenset[str]:
    """The card models a selector means: each wanted name matches the known models that contain it
    as a whole word, ignoring case (``A100`` matches ``NVIDIA A100-SXM4-80GB``, not ``A1000``). A
    name that matches nothing stays as it is, so that the reason can name it."""
    found: set[str] = set()
    models = tuple(known)
    for name in wanted:
        word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", re.IGNORECASE)
        matched = {model for model in models if word.search(model)}
        found |= matched or {name}
    return frozenset(found)


def impossible(node: NodeState, ask: Ask) -> str:
    """Why ``ask`` can never fit ``node``, however long it waits; empty when it might.

    Only what no release or preemption changes: card models, how many cards the node has, and
    card memory sizes.
    """
    if ask.request is None:
        return ""
    wanted = [c for c in node.cards if not ask.models or c.model in ask.models]
    if not wanted:
        models = ", ".join(sorted(node.models)) or "no cards"
        return f"no card of model {'|'.join(sorted(ask.models))} (has {models})"
    if len(wanted) < ask.count:
        return f"has {len(wanted)} card(s) that qualify, the pod needs {ask.count}"
    if ask.request.mig:
        return mig_impossible(wanted, ask.request)
    big = [c for c in wanted if c.mem_total == UNTRACKED or c.mem_total >= ask.mem]
    if len(big) < ask.count:
        largest = max(c.mem_total for c in wanted)
        return f"its largest card has {largest} MiB, the pod needs {ask.mem} MiB on each of {ask.count}"
    return ""


def _plan_cards(
    ledger: NodeLedger,
    pod: PodAsk,
    policy: Policy,
    slots_per_card: int | None,
    mix_isolation: bool,
    chooser: MigChooser | None,
) -> tuple[Grant, ...]:
    """Cards for every container of ``pod`` on this node, or ``Exhausted`` with the reason. With
    ``slots_per_card`` (None: slots not counted) a card whose slots are all held takes no one new,
    and each app container takes a slot of each of its cards. A card held by another isolation
    tier takes none of the pod's containers unless ``mix_isolation``. A MIG container's instances
    are chosen by ``mig_fit.fit_mig`` with ``chooser`` (None: every profile alike), beside every
    instance of the pod planned before it (the ledger holds all of an allocation's at once)."""
    base = ledger.live()
    grants: list[Grant] = []
    apps: list[Grant] = []
    for container in pod.containers:
        if container.request.mig:
            grants.append(_mig_grant(ledger, container, grants, slots_per_card, chooser))
            if not container.init:
                apps.append(grants[-1])
            continue
        held = base if container.init else (*base, _provisional(ledger, pod.owner, apps))
        state = from_ledger(NodeLedger(ledger.node, held), slots_per_card=slots_per_card, mix_isolation=mix_isolation)
        ask = pod.ask(container)
        found = place([state], ask, policy)
        if not isinstance(found, Decision):
            why = found.reasons[0][1] if found.reasons else "does not fit"
            raise Exhausted(f"{ledger.node.name}: container {container.container}: {why}")
        grant = Grant(container.container, shares(ledger.node, ask, found), container.init)
        grants.append(grant)
        if not container.init:
            apps.append(grant)
    if slots_per_card and len(grants) > len(apps):  # init containers alone on a card take a slot each
        whole = slot_problem(ledger, _provisional(ledger, pod.owner, grants), slots_per_card)
        if whole:
            raise Exhausted(f"{ledger.node.name}: {whole}")
    return tuple(grants)


def plan(
    ledger: NodeLedger,
    pod: PodAsk,
    policy: Policy,
    *,
    slots_per_card: int | None,
    mix_isolation: bool = False,
    chooser: MigChooser | None = None,
) -> tuple[Grant, ...]:
    """Cards for every container of ``pod`` on this node, or ``Exhausted`` with the reason
    (``_plan_cards``: slots, isolation tiers, MIG instances). A pod with NVLink constraints
    (``linked``, a claim's) keeps them: the policy's own plan where it does, else the policy's plan
    inside the node's NVLink groups (one group per constraint, the node's other cards fenced off
    for the whole pod), the groups most used first (the untouched ones are kept whole for the next
    linked pod); ``Exhausted`` naming the broken constraint where none keeps them."""
    grants = _plan_cards(ledger, pod, policy, slots_per_card, mix_isolation, chooser)
    why = pod.unlinked(ledger.node, grants)
    if not why:
        return grants
    free = {c.index: c.mem_free for c in card_states(ledger, ledger.use(), {}, None)}
    combos = itertools.islice(itertools.product(*(group_cards(ledger.node, c.size) for c in pod.linked)), LINKED_TRIES)
    allowed = sorted({frozenset().union(*combo) for combo in combos}, key=lambda a: (sum(free[i] for i in a), min(a)))
    for cards in allowed:
        with contextlib.suppress(Exhausted):
            found = _plan_cards(_fenced(ledger, cards), pod, policy, slots_per_card, mix_isolation, chooser)
            if not pod.unlinked(ledger.node, found):
                return found
    raise Exhausted(f"{ledger.node.name}: {why}")


def _fenced(ledger: NodeLedger, allowed: frozenset[int]) -> NodeLedger:
    """The ledger with every card outside ``allowed`` held whole: a plan on it takes only those."""
    whole = Request(1)
    shares = tuple(share_for(card, whole) for card in ledger.node.cards if card.index not in allowed)
    fence = Allocation(AllocationId("-fence-"), FENCE, ledger.node.name, (Grant("-fence-", shares),))
    return NodeLedger(ledger.node, (*ledger.allocations, fence))


def _mig_grant(
    ledger: NodeLedger,
    container: ContainerAsk,
    grants: list[Grant],
    slots_per_card: int | None,
    chooser: MigChooser | None,
) -> Grant:
    taken = [share for grant in grants for share in grant.cards]
    try:
        found = fit_mig(ledger, container.request, chooser or MigChooser(), slots_per_card, taken)
    except Exhausted as err:
        why = str(err).removeprefix(f"{ledger.node.name}: ")
        raise Exhausted(f"{ledger.node.name}: container {container.container}: {why}") from err
    return Grant(container.container, found, container.init)


def _provisional(ledger: NodeLedger, owner: Owner, grants: list[Grant]) -> Allocation:
    return Allocation(AllocationId("-planned-"), owner, ledger.node.name, tuple(grants))


def reserve_pod(
    ledger: NodeLedger,
    pod: PodAsk,
    policy: Policy,
    allocation_id: AllocationId,
    *,
    now: float,
    lease_s: float,
    slots_per_card: int,
    hint: Hint | None = None,
    mix_isolation: bool = False,
    chooser: MigChooser | None = None,
) -> NodeLedger:
    """The one transition that places ``pod`` on this node: cards chosen on this very ledger,
    device IDs assigned, reserved. Raises ``Exhausted`` with the reason when it does not fit
    (a card held by another isolation tier counts as full unless ``mix_isolation``).

    ``hint``: card indexes per container chosen for this pod earlier (placement's filter), taken
    while they still fit, so that the pods chosen for this node beside it keep fitting too;
    otherwise (or if the hint does not match the pod) the cards are chosen again. A pod's MIG
    instances are chosen again (``chooser``) on this very ledger: a hint names no placement."""
    hinted = hinted_grants(ledger, pod, hint) if hint is not None else None
    if hinted is not None:
        with contextlib.suppress(Exhausted):
            return reserve_grants(ledger, pod, allocation_id, hinted, now, lease_s, slots_per_card, mix_isolation)
    grants = plan(ledger, pod, policy, slots_per_card=slots_per_card, mix_isolation=mix_isolation, chooser=chooser)
    return reserve_grants(ledger, pod, allocation_id, grants, now, lease_s, slots_per_card, mix_isolation)


def reserve_grants(
    ledger: NodeLedger,
    pod: PodAsk,
    allocation_id: AllocationId,
    grants: tuple[Grant, ...],
    now: float,
    lease_s: float,
    slots_per_card: int,
    mix_isolation: bool = False,
) -> NodeLedger:
    """The ledger with ``pod`` reserved on ``grants`` (the cards chosen for it), with its device IDs;
    ``Exhausted`` when the ledger refuses them."""
    requests = tuple(c.request for c in pod.containers)
    allocation = reservation(
        allocation_id, pod.owner, ledger.node.name, grants, requests, isolation=pod.isolation, now=now, lease_s=lease_s
    )
    return reserve(ledger, assign_device_ids(ledger, allocation, slots_per_card), mix_isolation=mix_isolation)


def hint_of(grants: tuple[Grant, ...]) -> Hint:
    """The card indexes of each grant: what ``reserve_pod`` takes as a hint."""
    return tuple(tuple(share.index for share in grant.cards) for grant in grants)


def hinted_grants(ledger: NodeLedger, pod: PodAsk, hint: Hint) -> tuple[Grant, ...] | None:
    """The pod's grants on the hinted cards (shares as its requests say), or None when the hint
    does not match the pod and this node (another count of containers or cards, a card not here
    or of another model, or a MIG container: a hint names cards, not placements)."""
    cards = {card.index: card for card in ledger.node.cards}
    if len(hint) != len(pod.containers) or pod.mig:
        return None
    grants = []
    for container, indexes in zip(pod.containers, hint, strict=True):
        if len(indexes) != container.request.count or len(set(indexes)) != len(indexes):
            return None
        if any(i not in cards or not container.request.allows(cards[i].model) for i in indexes):
            return None
        shares_ = tuple(share_for(cards[i], container.request) for i in indexes)
        grants.append(Grant(container.container, shares_, container.init))
    return tuple(grants)
