"""CDI specs of the MIG devices the runtime's own spec does not define (the CDI strategies).

NVIDIA's container toolkit writes the node's CDI spec (``nvidia-ctk cdi generate``) with the MIG
devices that existed when it ran; an instance made on demand later is in no spec, and the runtime
could not resolve ``<cdi_kind>=MIG-...``. So, for each instance an Allocate answer names, the
plugin writes a spec of its own into its first CDI spec directory, ``gpuledger-mig-<MIG uuid>.json``:
the kind the plugin names devices under (``cdi_kind``), one device named by the MIG UUID, built as
the toolkit builds a MIG device (its ``newNvmlMigDiscoverer``):

- the spec-level ``containerEdits`` of the toolkit's spec that defines the parent card (by its
  UUID, under the same kind): the driver's libraries, hooks and control device nodes;
- the device's device nodes: the parent card's ``/dev/nvidia<minor>`` (the toolkit's entry for
  it, else made here) and the capability nodes ``/dev/nvidia-caps/nvidia-cap<N>`` of its GPU and
  compute instance (the driver's MIG minors file).

Nothing is written for an instance another spec already defines (a static one the toolkit
listed): two specs of one directory defining a device make it a conflict the runtime refuses. A
spec of ours whose device another spec now defines (the toolkit ran again) is removed. Without a
toolkit spec defining the parent card, nothing is written and the caller refuses the container,
naming what is missing.

A spec lives as long as its instance: it is removed once the instance leaves its card's
``instances`` in the node's ledger (the inventory destroyed it; ``follow``), not when its holder
releases it, since a restarted container is resolved again and a holder arriving within the
inventory's keep takes the instance as it is. A spec of ours whose instance is not in the first
ledger this process sees is left over from before (destroyed while the plugin was away): removed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.model import Node
from gpuledger_plugin.answer import on_host
from gpuledger_plugin.cdi_specs import CdiSpecs, Spec, write_spec

log = logging.getLogger(__name__)

PREFIX = "gpuledger-mig-"
HOST_PATH_VERSION = (0, 5, 0)  # the first CDI spec version whose device nodes may name a hostPath
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def spec_file(mig_uuid: str) -> str:
    """``gpuledger-mig-<MIG uuid>.json`` (an old driver's ``MIG-GPU-.../7/0`` with ``-`` for ``/``)."""
    return f"{PREFIX}{_UNSAFE.sub('-', mig_uuid)}.json"


def parent_of(specs: Sequence[tuple[str, Spec]], kind: str, card_uuid: str) -> tuple[Spec, Spec] | None:
    """The toolkit's spec and device that define the card ``card_uuid`` under ``kind``, if any."""
    for path, spec in specs:
        if Path(path).name.startswith(PREFIX) or spec.get("kind") != kind:
            continue
        for device in spec.get("devices") or []:
            if isinstance(device, dict) and device.get("name") == card_uuid:
                return spec, device
    return None


def mig_spec(
    toolkit: Spec, parent: Spec, kind: str, made: MadeMig, card_node: str, caps: Sequence[str], device_dir: str
) -> Spec:
    """The spec of the MIG device ``made``: the toolkit spec's own edits, and as the device's edits
    its card's node ``card_node`` (``/dev/nvidia<minor>``, the parent's entry if it has one) and
    the capability nodes ``caps``; nodes named at ``/dev`` in the container, under ``device_dir``
    on the host."""
    edits = parent.get("containerEdits") or {}
    theirs = [n for n in edits.get("deviceNodes") or [] if isinstance(n, dict) and n.get("path") == card_node]
    nodes = theirs[:1] or [_node(card_node, device_dir)]
    nodes += [_node(path, device_dir) for path in caps]
    version = str(toolkit.get("cdiVersion") or "0.3.0")
    if any("hostPath" in n for n in nodes) and _version(version) < HOST_PATH_VERSION:
        version = ".".join(map(str, HOST_PATH_VERSION))
    spec: Spec = {"cdiVersion": version, "kind": kind}
    if toolkit.get("containerEdits"):
        spec["containerEdits"] = toolkit["containerEdits"]
    spec["devices"] = [{"name": made.uuid, "containerEdits": {"deviceNodes": nodes}}]
    return spec


def _node(path: str, device_dir: str) -> dict[str, str]:
    host = on_host(path, device_dir)
    return {"path": path} if host == path else {"path": path, "hostPath": host}


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return (0,)


class MigCdi:
    """The plugin's MIG device specs in ``specs``' first directory (see the module doc)."""

    def __init__(self, specs: CdiSpecs, kind: str, device_dir: str) -> None:
        self.specs, self.kind, self.device_dir = specs, kind, device_dir
        self.directory = Path(specs.dirs[0])
        self.written: set[str] = set()  # MIG uuids whose spec this process wrote
        self.seen: set[str] = set()  # MIG uuids the node's ledger has shown

    def ensure(self, card_uuid: str, made: MadeMig, card_node: str, caps: Sequence[str]) -> None:
        """The runtime can resolve ``<kind>=<made.uuid>``: another spec defines it, or ours does
        (written now); ``FailedPrecondition`` naming what is missing when no spec defines the card."""
        name = f"{self.kind}={made.uuid}"
        ours = self.directory / spec_file(made.uuid)
        others = [p for p in self.specs.defining(name) if Path(p) != ours]
        if others:
            self._remove(ours, f"{others[0]} defines {name}")
            return
        found = parent_of(self.specs.specs(), self.kind, card_uuid)
        if found is None:
            raise FailedPrecondition(
                f"no CDI spec in {', '.join(self.specs.dirs)} defines the card {self.kind}={card_uuid}, from whose "
                f"spec the MIG device {made.uuid} is described (has the NVIDIA container toolkit written its spec, "
                "e.g. with nvidia-ctk cdi generate --device-name-strategy uuid?)"
            )
        spec = mig_spec(*found, self.kind, made, card_node, caps, self.device_dir)
        try:
            if write_spec(ours, spec):
                log.info("wrote the CDI spec %s for the MIG device %s (card %s)", ours, made.uuid, card_uuid)
        except OSError as err:
            raise FailedPrecondition(f"cannot write the CDI spec {ours} of the MIG device {made.uuid}: {err}") from err
        self.written.add(made.uuid)

    def follow(self, node: Node | None) -> None:
        """Remove our specs whose instance left the node's ledger (see the module doc)."""
        if node is None:
            return
        present = {i.uuid for card in node.cards for i in card.instances if i.uuid}
        for path, uuid in self._ours():
            if uuid not in present and (uuid in self.seen or uuid not in self.written):
                self._remove(path, f"the MIG device {uuid} is no longer on node {node.name}")
        self.seen |= present

    def _ours(self) -> list[tuple[Path, str]]:
        found = []
        for path in sorted(self.directory.glob(f"{PREFIX}*.json")):
            try:
                spec = json.loads(path.read_text())
                found.append((path, str(spec["devices"][0]["name"])))
            except (OSError, ValueError, LookupError, TypeError) as err:
                log.warning("CDI spec %s is not one of the plugin's MIG specs: %s", path, err)
        return found

    def _remove(self, path: Path, why: str) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as err:
            log.warning("could not remove the CDI spec %s (%s): %s", path, why, err)
            return
        log.info("removed the CDI spec %s: %s", path, why)
