"""The fault policy: what a fault means for its card, by XID and by error class. Pure.

Every fault gets an ``Action``; the actions, from least to most severe:

- ``application``: the application's own fault (or nothing wrong); nothing happens to the card;
- ``no-new-work``: the card takes no new work, its holders keep running;
- ``drain``: no new work, and its holders are moved off; the card comes back after a check;
- ``reset``: drain, reset the card once it is empty, then check it;
- ``retire``: drain, and the card stays out of service until an operator acts.

XIDs are looked up in ``xid_catalog`` (written from NVIDIA's Xid catalog), under the operator's
overrides (``xid_actions``; ``ignore_xids`` names XIDs that are ``application``). Faults that are
not XIDs have a class each (``FaultClass``). docs/xid-policy.md gives every choice and its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpuledger_inventory.inventory import EventKind, GpuEvent
from gpuledger_inventory.xid_catalog import CATALOG


class Action(StrEnum):
    """What a fault does to its card; declared in order of severity."""

    APPLICATION = "application"
    NO_NEW_WORK = "no-new-work"
    DRAIN = "drain"
    RESET = "reset"
    RETIRE = "retire"

    @property
    def severity(self) -> int:
        return list(Action).index(self)

    def at_least(self, other: Action) -> Action:
        """The more severe of the two."""
        return self if self.severity >= other.severity else other


class FaultClass(StrEnum):
    """A fault that is not a catalogued XID."""

    ECC_UNCORRECTABLE = "ecc-uncorrectable"  # a double-bit ECC event
    ROW_REMAP_PENDING = "row-remap-pending"
    ROW_REMAP_FAILURE = "row-remap-failure"
    LOST = "lost"  # the card fell off the bus (NVML's GpuIsLost)
    NVML = "nvml"  # NVML itself fails: every card
    REGISTRATION = "registration"  # the card's health events could not be registered
    UNATTRIBUTED = "unattributed"  # an event NVML could not tie to a card: every card
    OPERATOR = "operator"
    UNKNOWN_XID = "unknown-xid"  # an XID the catalog does not list


CLASS_ACTIONS: Mapping[FaultClass, tuple[Action, str]] = {
    FaultClass.ECC_UNCORRECTABLE: (Action.RESET, "as XID 48: a reset clears it, and remaps the row"),
    FaultClass.ROW_REMAP_PENDING: (
        Action.APPLICATION,
        "NVIDIA: running and new work are unaffected; the remap takes effect at the next reset",
    ),
    FaultClass.ROW_REMAP_FAILURE: (
        Action.RETIRE,
        "no spare row was left: NVIDIA counts it towards returning the card, and no reset mends it",
    ),
    FaultClass.LOST: (Action.RESET, "as XID 79: a card-level reset first, the node only if that fails"),
    FaultClass.NVML: (Action.NO_NEW_WORK, "the driver, not the card, failed; rule nvml-returned heals it"),
    FaultClass.REGISTRATION: (Action.NO_NEW_WORK, "its faults cannot be seen, so it gets no new work"),
    FaultClass.UNATTRIBUTED: (
        Action.NO_NEW_WORK,
        "every card is suspect, none is known bad: no new work, and no holder is moved on a guess",
    ),
    FaultClass.OPERATOR: (Action.NO_NEW_WORK, "an operator's word, unless it names another action"),
    FaultClass.UNKNOWN_XID: (
        Action.NO_NEW_WORK,
        "newer than the catalog: no new work until someone looks, and no holder moved on a guess",
    ),
}


# NVIDIA's immediate action (the catalog's resolution bucket) -> ours, and why
BUCKET_ACTIONS: Mapping[str, tuple[Action, str]] = {
    "RESTART_APP": (Action.APPLICATION, "restarting the application recovers; the card is fine"),
    "IGNORE": (Action.APPLICATION, "NVIDIA: no action needed"),
    "WORKFLOW_XID_45": (Action.APPLICATION, "follows another XID, which decides"),
    "RESET_GPU": (Action.RESET, "a GPU reset recovers"),
    "WORKFLOW_XID_48": (Action.RESET, "NVIDIA: reset the GPU (drain and reset when a remap came with it)"),
    "WORKFLOW_NVLINK_ERR": (Action.RESET, "NVIDIA: a GPU reset or a node reboot clears it"),
    "RESTART_BM": (
        Action.RESET,
        "NVIDIA restarts the machine; a card-level reset first costs one card, not the node; "
        "a failed reset or check retires the card for that restart",
    ),
    "RESTART_VM": (Action.DRAIN, "its holders must restart; the card needs no reset"),
    "CONTACT_SUPPORT": (Action.NO_NEW_WORK, 'NVIDIA gives only "contact support": no new work until someone looks'),
    "CHECK_MECHANICALS": (Action.NO_NEW_WORK, "someone must check it by hand; it runs, slowly, meanwhile"),
    "UPDATE_SWFW": (Action.NO_NEW_WORK, "the software must be updated by hand"),
    "WORKFLOW_NVLINK5_ERR": (
        Action.NO_NEW_WORK,
        "fatal or harmless only by the message's codes, which NVML's event does not carry",
    ),
    "XID_154": (
        Action.NO_NEW_WORK,
        "the recovery it names is in its message, not in NVML's event; the XID it comes with decides",
    ),
    "CHECK_UVM": (Action.NO_NEW_WORK, "a reset only where UVM or vGPU is in use, which the event does not say"),
    "": (Action.NO_NEW_WORK, "the catalog gives no action: the default for an unknown XID"),
}

# where we do other than the catalog's bucket says, and why
EXCEPTIONS: Mapping[int, tuple[Action, str]] = {
    32: (Action.NO_NEW_WORK, "NVIDIA: mostly the PCIe link's quality, seldom the application"),
    64: (
        Action.RETIRE,
        "a failed remap leaves the bad row in use; a reset does not mend it, and NVIDIA's memory "
        "error guide counts remapping failures towards returning the card",
    ),
    94: (
        Action.NO_NEW_WORK,
        "the other holders are unaffected and NVIDIA asks for a reset when convenient: the card "
        "empties without anyone moved",
    ),
    157: (Action.NO_NEW_WORK, "NVIDIA: work still runs, but nothing can be repaired and the fault may recur"),
    162: (Action.APPLICATION, "a capability came back"),
    163: (Action.APPLICATION, "NVIDIA: no reset needed; only power smoothing is off"),
    164: (Action.APPLICATION, "NVIDIA: watch the power swings; the card works"),
    165: (Action.APPLICATION, "the card works; only power smoothing is gone"),
    171: (Action.RESET, "details of an XID 48, which is reset"),
    172: (Action.RESET, "details of an XID 48, which is reset"),
}


def catalog_action(xid: int) -> tuple[Action, str]:
    """The action for a catalogued XID before any override, and why; KeyError if not listed."""
    info = CATALOG[xid]
    return EXCEPTIONS.get(xid) or BUCKET_ACTIONS[info.recovery]


@dataclass(frozen=True, slots=True)
class FaultPolicy:
    """The catalog under the operator's overrides (XID -> action)."""

    overrides: Mapping[int, Action] = field(default_factory=dict)

    def for_xid(self, xid: int) -> tuple[Action, str]:
        """The XID's action and its meaning (the catalog's, or that it is not listed)."""
        info = CATALOG.get(xid)
        meaning = info.meaning if info else "not in the catalog"
        if xid in self.overrides:
            return self.overrides[xid], meaning
        if info is None:
            return self.for_class(FaultClass.UNKNOWN_XID), meaning
        return catalog_action(xid)[0], meaning

    def for_class(self, fault: FaultClass) -> Action:
        return CLASS_ACTIONS[fault][0]

    def action_for(self, event: GpuEvent) -> tuple[Action, str]:
        """A health event's action and the reason to record; ``application`` for events that
        leave the card alone. An event that names no card never does more than ``no-new-work``."""
        where = f" on {event.mig_uuid}" if event.mig_uuid else ""
        if event.kind is EventKind.XID and event.xid is not None:
            action, meaning = self.for_xid(event.xid)
            reason = f"XID {event.xid}{where}: {meaning}"
        elif event.kind is EventKind.ECC_DOUBLE:
            action, reason = self.for_class(FaultClass.ECC_UNCORRECTABLE), f"double-bit ECC error{where}"
        else:
            return Action.APPLICATION, ""
        if event.uuid is None and action is not Action.APPLICATION:
            return self.for_class(FaultClass.UNATTRIBUTED), f"{reason} (on a card NVML could not name)"
        return action, reason


def parse_actions(text: str) -> dict[int, Action]:
    """``"79=retire, 13=drain"`` as {79: RETIRE, 13: DRAIN}; ValueError names the bad item."""
    items = [item.strip() for item in text.split(",")]
    if items == [""]:
        return {}
    actions: dict[int, Action] = {}
    for i, item in enumerate(items, 1):
        xid, action = _parse_item(item, f"item {i} ({item!r})")
        if xid in actions and actions[xid] is not action:
            raise ValueError(f"item {i} ({item!r}): XID {xid} is given two actions")
        actions[xid] = action
    return actions


def _parse_item(item: str, where: str) -> tuple[int, Action]:
    number, sep, name = (part.strip() for part in item.partition("="))
    if not sep:
        raise ValueError(f"{where}: must be XID=ACTION, e.g. 79=retire")
    if not number.isdigit() or int(number) < 1:
        raise ValueError(f"{where}: {number!r} is not an XID (a positive whole number)")
    if name not in set(Action):
        raise ValueError(f"{where}: {name!r} is not an action ({'|'.join(Action)})")
    return int(number), Action(name)


def fault_policy(ignored_xids: Iterable[int], xid_actions: str) -> FaultPolicy:
    """The policy from the two settings: ``ignored_xids`` are ``application``; an XID named in
    both with another action is an error (ValueError, naming the XID)."""
    actions = parse_actions(xid_actions)
    for xid in sorted(ignored_xids):
        given = actions.setdefault(xid, Action.APPLICATION)
        if given is not Action.APPLICATION:
            raise ValueError(f"XID {xid} is in ignore_xids (application) and in xid_actions as {given}")
    return FaultPolicy(actions)
