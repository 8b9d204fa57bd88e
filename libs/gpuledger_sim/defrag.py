"""Defragmentation in the FGD replay (``gpuledger sim --defrag``, docs/defragmentation.md): when an
arriving pod fits nowhere, a few placed pods that hold cards are moved to other nodes so that it
fits on one (``gpuledger_core.repack``: the fewest moves off one node, each moved pod fitting on
another node by the same fit as any placement).

``Holdings`` mirrors the replay's placements as the nodes' ledgers (who holds which cards), which
``repack`` reads; the replay rebuilds a changed node's state from the pods left on it.

What one failed pod may cost (searching the whole cluster for every failed pod would be slow):

- **nodes to clear**: only nodes whose host has the pod's CPU and memory free now, with enough
  cards of a model it allows, and of those the ``Budget.nodes`` that lack the least compute for it
  (over the pod's count of cards with the most room, what each lacks for the pod's share; a whole
  card lacks all its held compute); node order breaks ties;
- **where moved pods go**: any other node with a card whose room takes the smallest share of the
  pods that could move (none such: nothing is searched), whose host has the moved pod's CPU
  and memory free and which has enough cards with room for it (checked on the replay's node
  states before the ledger's fit is asked); moved pods go where ``repack`` puts them (best fit by
  memory left, which here, with shares asking compute only, is the first such node in name
  order), not where the policy would have put them. A set of moves whose pods, together, would
  pass a destination's CPU or memory is not made;
- **moves**: at most ``Budget.per_pod`` for one pod, and at most ``Budget.total`` in all;
- **when**: until arrived GPU requests reach 100 % of capacity (the replay's figure is taken
  there; moves after it would change nothing reported and cost the most time).

Every placed pod that holds cards is movable; pods without cards never move (the ledger does not
hold them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpuledger_core.errors import InvalidArgument
from gpuledger_core.fit import ContainerAsk, share_for
from gpuledger_core.ids import AllocationId, NodeName
from gpuledger_core.ledger import NodeLedger
from gpuledger_core.model import Allocation, AllocState, Grant, Owner, OwnerKind
from gpuledger_core.packing import Ask, NodeState, Policy
from gpuledger_core.pods import PodAsk
from gpuledger_core.preemption import Fit, Holder
from gpuledger_core.repack import Repack, repack
from gpuledger_sim.ledgers import ledger_of
from gpuledger_sim.trace import WHOLE, TraceNode

NAMESPACE = "sim"
NODES_SEARCHED = 16  # nodes to clear searched per failed pod, unless told


@dataclass(frozen=True, slots=True)
class Budget:
    """How much defragmentation may move: ``per_pod`` moves for one pod that fits nowhere, ``total``
    over the replay (None: no limit), searching ``nodes`` nodes to clear per pod."""

    per_pod: int
    total: int | None = None
    nodes: int = NODES_SEARCHED

    def __post_init__(self) -> None:
        if self.per_pod < 1:
            raise InvalidArgument("--defrag", f"moves per pod must be 1 or more, got {self.per_pod}")
        if self.total is not None and self.total < 0:
            raise InvalidArgument("--defrag", f"the total of moves must be 0 or more, got {self.total}")
        if self.nodes < 1:
            raise InvalidArgument("--defrag-nodes", f"must be 1 or more, got {self.nodes}")

    @staticmethod
    def parse(raw: str, nodes: int = NODES_SEARCHED) -> Budget:
        """``MOVES`` or ``MOVES:TOTAL``."""
        per_pod, sep, total = raw.partition(":")
        try:
            return Budget(int(per_pod), int(total) if sep else None, nodes)
        except ValueError:
            raise InvalidArgument("--defrag", f"must be MOVES or MOVES:TOTAL, got {raw!r}") from None


@dataclass(frozen=True, slots=True)
class Placed:
    """A pod on a node: what it asked, its cards (positions) and its ledger entry (None: no cards)."""

    name: str
    ask: Ask
    cards: tuple[int, ...]
    allocation: Allocation | None


@dataclass(slots=True)
class Tally:
    """What defragmentation did: pods searched for, pods let in, moves made, time spent."""

    searched: int = 0
    let_in: int = 0
    moves: int = 0
    refused_by_host: int = 0
    no_destination: int = 0  # pods for which no card anywhere had room for any pod that could move
    seconds: float = 0.0


def owner_of(name: str) -> Owner:
    return Owner(OwnerKind.POD, name, NAMESPACE, name)


class Holdings:
    """Who holds which cards on every node (ledgers, by node position), and who runs where."""

    def __init__(self, nodes: Sequence[TraceNode], policy: Policy, budget: Budget):
        self.ledgers = [ledger_of(n) for n in nodes]
        self.position = {n.name: at for at, n in enumerate(nodes)}
        self.on_node: list[dict[str, Placed]] = [{} for _ in nodes]
        self.fit = Fit(policy)
        self.budget = budget
        self.tally = Tally()

    def add(self, at: int, name: str, ask: Ask, cards: tuple[int, ...]) -> None:
        allocation = None
        if ask.request is not None:
            ledger = self.ledgers[at]
            shares = tuple(share_for(ledger.node.cards[i], ask.request) for i in cards)
            allocation = Allocation(AllocationId(name), owner_of(name), ledger.node.name, (Grant("main", shares),),
                                    AllocState.BOUND, requests=(ask.request,))  # fmt: skip
            self.ledgers[at] = NodeLedger(ledger.node, (*ledger.allocations, allocation))
        self.on_node[at][name] = Placed(name, ask, cards, allocation)

    def remove(self, at: int, name: str) -> Placed:
        placed = self.on_node[at].pop(name)
        if placed.allocation is not None:
            ledger = self.ledgers[at]
            self.ledgers[at] = NodeLedger(ledger.node, tuple(a for a in ledger.allocations if a.id != name))
        return placed

    def placed_on(self, at: int) -> list[Placed]:
        """The node's pods, in the order they came."""
        return list(self.on_node[at].values())

    def make_room(self, name: str, ask: Ask, states: Sequence[NodeState]) -> list[int]:
        """Move pods so that ``ask`` fits (see the module's note); the positions of the nodes changed
        (empty: nothing moved)."""
        left = self.budget.per_pod
        if self.budget.total is not None:
            left = min(left, self.budget.total - self.tally.moves)
        if ask.request is None or left <= 0:
            return []
        started = time.perf_counter()
        self.tally.searched += 1
        found = self._search(name, ask, states, left)
        self.tally.seconds += time.perf_counter() - started
        if found is None:
            return []
        return self._apply(found)

    def _search(self, name: str, ask: Ask, states: Sequence[NodeState], left: int) -> Repack | None:
        targets = self._targets(ask, states)
        if not targets:
            return None
        smallest = min((_need(p.ask) for at in targets for p in self.placed_on(at) if p.allocation), default=WHOLE + 1)
        places = [at for at in range(len(states)) if _best_room(states[at]) >= smallest]
        if not places or (len(places) == 1 and places == targets):  # nowhere, or only the node to clear
            self.tally.no_destination += 1
            return None
        roomy = sorted({*targets, *places})
        movable = {a.owner.key: Holder(0) for at in targets for a in self.ledgers[at].live()}

        def host(allocation: Allocation, node: NodeName) -> bool:
            moved = self._placed(allocation).ask
            return _takes(states[self.position[node]], moved)

        found = repack([self.ledgers[at] for at in roomy], _pod_ask(name, ask), movable, self.fit, 0.0, left,
                       host, {self.ledgers[at].node.name for at in targets})  # fmt: skip
        if found is None or not self._hosts_take(found, states):
            return None
        return found

    def _targets(self, ask: Ask, states: Sequence[NodeState]) -> list[int]:
        """The ``Budget.nodes`` nodes that lack the least compute for ``ask`` (none that lack nothing)."""
        ranked = []
        for at, state in enumerate(states):
            lack = _lack(state, ask)
            if lack:
                ranked.append((lack, at))
        ranked.sort()
        return [at for _, at in ranked[: self.budget.nodes]]

    def _hosts_take(self, found: Repack, states: Sequence[NodeState]) -> bool:
        """Whether every destination's host has CPU and memory for all the pods moved there."""
        asked: dict[NodeName, tuple[int, int]] = {}
        for move in found.moves:
            ask = self._placed(move.allocation).ask
            cpu, mem = asked.get(move.to, (0, 0))
            asked[move.to] = (cpu + ask.cpu_milli, mem + ask.memory_mib)
        for node, (cpu, mem) in asked.items():
            state = states[self.position[node]]
            if state.cpu_free < cpu or state.mem_free < mem:
                self.tally.refused_by_host += 1
                return False
        return True

    def _placed(self, allocation: Allocation) -> Placed:
        return self.on_node[self.position[allocation.node]][allocation.owner.id]

    def _apply(self, found: Repack) -> list[int]:
        source = self.position[found.node]
        changed = [source]
        for move in found.moves:
            placed = self.remove(source, move.allocation.owner.id)
            to = self.position[move.to]
            self.add(to, placed.name, placed.ask, tuple(s.index for g in move.grants for s in g.cards))
            changed.append(to)
        self.tally.moves += len(found.moves)
        return list(dict.fromkeys(changed))


def _pod_ask(name: str, ask: Ask) -> PodAsk:
    assert ask.request is not None
    return PodAsk(owner_of(name), (ContainerAsk("main", ask.request),), cpu_milli=ask.cpu_milli,
                  memory_mib=ask.memory_mib)  # fmt: skip


def _need(ask: Ask) -> int:
    """The compute ``ask`` needs on each of its cards (all of a card, for a whole card)."""
    return WHOLE if ask.exclusive else ask.core


def _best_room(state: NodeState) -> int:
    return max((card.room for card in state.cards), default=0)


def _cards_for(state: NodeState, ask: Ask) -> list[int]:
    """The rooms of the node's cards that ``ask`` may use (its models), most room first."""
    assert ask.request is not None
    return sorted((c.room for c in state.cards if ask.request.allows(c.model)), reverse=True)


def _lack(state: NodeState, ask: Ask) -> int:
    """What compute the node's best cards lack for ``ask`` (0: none, or it cannot be cleared: its
    host or its cards could not take the pod whatever moved)."""
    if state.cpu_free < ask.cpu_milli or state.mem_free < ask.memory_mib:
        return 0
    rooms = _cards_for(state, ask)
    if len(rooms) < ask.count:
        return 0
    need = _need(ask)
    return sum(max(0, need - room) for room in rooms[: ask.count])


def _takes(state: NodeState, ask: Ask) -> bool:
    """Whether the node, as its state reads, has host and card room for ``ask`` (a quick check
    before the ledger's fit)."""
    if state.cpu_free < ask.cpu_milli or state.mem_free < ask.memory_mib:
        return False
    need = _need(ask)
    rooms = _cards_for(state, ask)
    return len(rooms) >= ask.count and all(room >= need for room in rooms[: ask.count])
