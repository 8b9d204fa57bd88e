"""The device plugin resources of a node's cards, their device lists, and which containers each
resource admits (pure).

One plugin process serves several kubelet resources, each on its own socket:

- ``gpuledger.io/gpu``: every card that is not in MIG mode;
- ``gpuledger.io/mig-<profile>``: every card in MIG mode whose model offers the profile
  (``mig.model_of``); a ``+me`` profile's ``+`` is written ``.`` (``1g.10gb.me``: ``mig.resource_of``);
- ``gpuledger.io/mig``: every card in MIG mode whose model has MIG at all (the smallest profile
  that fits is chosen per card by placement).

Each lists ``slots_per_card`` device IDs ``<card uuid>::<n>`` per card, healthy as the card: the
same IDs under every MIG resource of a card. The ledger never reserves one ID twice, so kubelet,
steered by GetPreferredAllocation, never hands one container's ID to another.

A resource's calls match only the containers that asked for it (``accepts``): the gpu resource
containers without MIG instances; a profile's resource containers holding instances of that profile
(and not asked as ``gpuledger.io/mig``, where the allocation's requests say so); ``gpuledger.io/mig``
those holding any instance that were not asked by profile.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuledger_core import mig
from gpuledger_core.model import MIG_SMALLEST, Allocation, Card, Grant, Node
from gpuledger_plugin.devices import HEALTHY, UNHEALTHY, Advertised, card_devices

GPU_RESOURCE = "gpuledger.io/gpu"
Accepts = Callable[[Allocation, int], bool]  # may a resource's call admit grant i of the allocation?


def mig_cards(node: Node | None) -> tuple[Card, ...]:
    """The node's cards in MIG mode whose model has MIG, by index."""
    if node is None:
        return ()
    return tuple(c for c in sorted(node.cards, key=lambda c: c.index) if c.mig and mig.model_of(c) is not None)


def device_lists(node: Node | None, slots_per_card: int) -> dict[str, tuple[Advertised, ...]]:
    """Every MIG resource the node's cards offer now, with its device list (no entry for the gpu
    resource, whose list is ``devices.advertised``)."""
    lists: dict[str, list[Advertised]] = {}
    for card in mig_cards(node):
        model = mig.model_of(card)
        assert model is not None
        devices = card_devices(card, slots_per_card, HEALTHY if card.healthy else UNHEALTHY)
        lists.setdefault(mig.RESOURCE, []).extend(devices)
        for profile in model.profiles:
            lists.setdefault(mig.resource_of(profile.name), []).extend(devices)
    return {name: tuple(found) for name, found in sorted(lists.items())}


def socket_name(base: str, resource: str) -> str:
    """The socket file of ``resource`` beside the gpu resource's ``base`` (``gpuledger.sock``):
    ``gpuledger-mig.sock``, ``gpuledger-mig-1g.10gb.sock``."""
    if resource == GPU_RESOURCE:
        return base
    stem = base.removesuffix(".sock")
    return f"{stem}-{resource.rpartition('/')[2]}.sock"


def ours(resource: str) -> bool:
    """Whether ``resource`` is one of the plugin's: the gpu resource or a MIG one."""
    return resource == GPU_RESOURCE or mig.is_resource(resource)


def has_mig(grant: Grant) -> bool:
    return any(s.mig is not None for s in grant.cards)


def _asked(allocation: Allocation, index: int) -> str | None:
    """The MIG ask of grant ``index`` as its request says (a profile, ``MIG_SMALLEST`` or empty);
    None where the allocation's requests do not line up with its grants."""
    requests = allocation.requests
    if len(requests) != len(allocation.grants):
        return None
    return requests[index].mig


def _without_mig(allocation: Allocation, index: int) -> bool:
    return not has_mig(allocation.grants[index])


def _any_instance(allocation: Allocation, index: int) -> bool:
    grant = allocation.grants[index]
    if not grant.cards or not all(s.mig is not None for s in grant.cards):
        return False
    asked = _asked(allocation, index)
    return asked is None or asked == MIG_SMALLEST


def _of_profile(profile: str) -> Accepts:
    def accepts(allocation: Allocation, index: int) -> bool:
        grant = allocation.grants[index]
        if not grant.cards or not all(s.mig is not None and s.mig.profile == profile for s in grant.cards):
            return False
        asked = _asked(allocation, index)
        return asked is None or asked == profile

    return accepts


def accepts(resource: str) -> Accepts:
    """Which containers a call of ``resource`` may be matching (see the module doc)."""
    if resource == GPU_RESOURCE:
        return _without_mig
    if resource == mig.RESOURCE:
        return _any_instance
    return _of_profile(mig.profile_of_resource(resource) or "")
