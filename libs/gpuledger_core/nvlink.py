"""NVLink groups: the disjoint sets of mutually NVLinked cards a node publishes as the DRA
attributes ``nvlinkGroup2``, ``nvlinkGroup4`` and ``nvlinkGroup8``, and whether cards chosen for
a claim's ``matchAttribute`` on one of them share a group. Pure: no I/O.

The inventory publishes the groups (``slices``) and mode C and preemption check against the very
same function, so that a claim the ledger allocates honours its constraint as Kubernetes reads it:
every device has the attribute and all have the same value. Cards linked to each other but in two
groups (a DGX-1's cross links, two cards of an NVSwitch node in different pairs) do not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger_core.model import Grant, Node

GROUP_SIZES = (2, 4, 8)


@dataclass(frozen=True, slots=True)
class Linked:
    """A constraint of a claim: the cards of ``containers`` (its requests) all in one NVLink group
    of ``size`` (``matchAttribute: <driver>/nvlinkGroup<size>``)."""

    size: int
    containers: tuple[str, ...]


def nvlink_groups(node: Node, size: int) -> dict[int, int]:
    """Card index -> group id for disjoint sets of ``size`` mutually NVLinked cards (greedy, lowest
    indexes first; the id is the group's lowest index). Cards left out of every full set get no id."""
    linked = {(ln.a, ln.b) for ln in node.links if ln.nvlinks > 0}

    def joined(a: int, b: int) -> bool:
        return (min(a, b), max(a, b)) in linked

    free = sorted(c.index for c in node.cards)
    groups: dict[int, int] = {}
    for start in list(free):
        if start in groups:
            continue
        members = [start]
        for other in free:
            if len(members) == size:
                break
            if other not in groups and other not in members and all(joined(other, m) for m in members):
                members.append(other)
        if len(members) == size:
            groups.update(dict.fromkeys(members, start))
    return groups


def group_cards(node: Node, size: int) -> list[frozenset[int]]:
    """The node's NVLink groups of ``size``, each as its card indexes, lowest first."""
    members: dict[int, set[int]] = {}
    for index, group in nvlink_groups(node, size).items():
        members.setdefault(group, set()).add(index)
    return [frozenset(members[g]) for g in sorted(members)]


def unlinked(node: Node, constraints: Iterable[Linked], grants: Iterable[Grant]) -> str:
    """Why the cards ``grants`` give break one of ``constraints``; empty when none does."""
    given = tuple(grants)
    for constraint in constraints:
        groups = nvlink_groups(node, constraint.size)
        cards = sorted({s.index for g in given if g.container in constraint.containers for s in g.cards})
        if len({groups.get(c) for c in cards}) > 1 or any(c not in groups for c in cards):
            return (
                f"cards {', '.join(map(str, cards))} for {', '.join(constraint.containers)} are not in one "
                f"NVLink group of {constraint.size}"
            )
    return ""
