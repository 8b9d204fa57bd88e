"""One CDI spec per prepared claim (CDI 0.3 features only; pure, but for ``write`` and ``remove``).

Kind ``k8s.gpu.gpuledger.io/claim``; one CDI device per allocated device, named
``<claim uid>-<device>[-<share id>]`` so that a name is never reused (runtimes cache specs): its
device node (``/dev/nvidia<minor>``). The spec's own edits apply to every container given any of
its devices: the control device nodes and the environment, in the order of the claim's devices:

- ``NVIDIA_VISIBLE_DEVICES``: the cards' UUIDs, comma-separated;
- ``GPULEDGER_CLAIM`` (``namespace/name``) and ``GPULEDGER_CLAIM_UID``;
- ``GPULEDGER_MEMORY_LIMIT_MIB`` and ``GPULEDGER_CORE_LIMIT_PERCENT``: per card, what the claim
  consumed of it (the whole card where the device is not shared);
- ``GPULEDGER_EXCLUSIVE``: ``true`` when no card of the claim is shared;
- ``CUDA_VISIBLE_DEVICES``: the UUIDs in the same order, so CUDA ordinal i is the claim's i-th card.

A MIG placement's device (``dra.mig``) is the instance the node's inventory made for it: its MIG
device UUID (``MIG-...``) where a card's UUID would be, in ``NVIDIA_VISIBLE_DEVICES`` and
``CUDA_VISIBLE_DEVICES``; its card's device node and, where the driver's MIG minors file exists,
the capability device nodes of its GPU and compute instance (as the classic plugin gives them,
``gpuledger_plugin.mig_answer``); its profile's memory and compute in the limits, and
``GPULEDGER_MIG``: each placement as ``<profile>@<start>``.

A claim with isolation ``mps`` (its class's or its own opaque ``SharingConfig``) is an MPS client,
as in classic mode (``gpuledger_plugin.answer``): ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` per CUDA
ordinal (``0=10240M,1=10240M``), ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the smallest compute share),
``CUDA_MPS_PIPE_DIRECTORY``, and the daemon's pipe directory (and, where set, its ``/dev/shm``)
mounted from the host.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core.claims import AllocatedDevice, ClaimAllocation, MiB
from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.model import Isolation, MigSlot
from gpuledger_plugin.answer import on_host
from gpuledger_plugin.cdi_specs import write_spec
from gpuledger_plugin.mig_answer import MigMinors, caps

VENDOR = "k8s.gpu.gpuledger.io"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
CDI_VERSION = "0.3.0"
HOST_PATH_VERSION = "0.5.0"  # the first CDI spec version whose device nodes may name a hostPath
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


@dataclass(frozen=True, slots=True)
class Mps:
    """Where MPS clients find the control daemon (the plugin's mps_* settings)."""

    pipe_dir: str = "/tmp/nvidia-mps"  # CUDA_MPS_PIPE_DIRECTORY in the container
    host_pipe_dir: str = "/run/nvidia/mps"
    host_shm_dir: str = ""  # the daemon's /dev/shm on the host; empty: not mounted


@dataclass(frozen=True, slots=True)
class Card:
    """A published device as the plugin needs it: read back from the node's ResourceSlices."""

    uuid: str
    index: int
    memory_mib: int
    minor: int | None = None
    mig: MigSlot | None = None  # the MIG placement the device is (its card's uuid, index and minor above)
    compute: int = 100  # percent of the card: a placement's profile's


def cards_of(slices: Sequence[Mapping[str, Any]]) -> dict[str, Card]:
    """Device name -> card, from the devices' attributes (slices.py and slices_mig.py write them)."""
    found: dict[str, Card] = {}
    for item in slices:
        for device in item.get("spec", {}).get("devices") or []:
            attrs = device.get("attributes") or {}
            minor = attrs.get("minor", {}).get("int")
            found[str(device["name"])] = Card(
                str(attrs.get("uuid", {}).get("string", "")),
                int(attrs.get("index", {}).get("int", -1)),
                int(attrs.get("memoryMiB", {}).get("int", 0)),
                None if minor is None else int(minor),
                *_placement(device),
            )
    return found


def _placement(device: Mapping[str, Any]) -> tuple[MigSlot | None, int]:
    attrs = device.get("attributes") or {}
    if "profile" not in attrs:
        return None, 100
    slot = MigSlot(str(attrs["profile"].get("string", "")), int(attrs.get("migStart", {}).get("int", -1)),
                   int(attrs.get("migSize", {}).get("int", 0)))  # fmt: skip
    return slot, int(((device.get("capacity") or {}).get("compute") or {}).get("value", 100))


def device_name(claim_uid: str, device: AllocatedDevice) -> str:
    parts = [claim_uid, device.device] + ([device.share_id] if device.share_id else [])
    return _UNSAFE.sub("-", "-".join(parts))


def cdi_id(name: str) -> str:
    return f"{KIND}={name}"


def spec(
    allocation: ClaimAllocation,
    cards: Mapping[str, Card],
    mps: Mps | None = None,
    device_dir: str = "/dev",
    made: Mapping[str, MadeMig] | None = None,
    minors: MigMinors | None = None,
) -> dict[str, Any]:
    """The claim's CDI spec; ``FailedPrecondition`` if a device is not among this node's cards.
    Device nodes are at ``/dev`` in the container and under ``device_dir`` on the host. ``made``:
    the instance made for each MIG placement (by device name); ``minors``: the MIG minors file."""
    devices, uuids, memory, compute, placements = [], [], [], [], []
    shared = False
    for device in allocation.devices:
        card = cards.get(device.device)
        if card is None:
            raise FailedPrecondition(
                f"{allocation.ref.describe()}: device {device.device} is not published for this node"
            )
        instance = (made or {}).get(device.device)
        if card.mig is not None and instance is None:
            raise FailedPrecondition(f"{allocation.ref.describe()}: no MIG instance was made for {device.device}")
        nodes = _nodes(card, instance, minors)
        edits = {"deviceNodes": [_device_node(n, device_dir) for n in nodes]} if nodes else {}
        devices.append({"name": device_name(allocation.ref.uid, device), "containerEdits": edits})
        uuids.append(instance.uuid if instance is not None else card.uuid)
        whole = device.memory_bytes is None or device.memory_bytes // MiB >= card.memory_mib
        whole = whole and (device.compute is None or device.compute >= 100)
        shared = shared or not whole
        memory.append(str(card.memory_mib if device.memory_bytes is None else device.memory_bytes // MiB))
        compute.append(str(card.compute if device.compute is None else device.compute))
        if card.mig is not None:
            placements.append(f"{card.mig.profile}@{card.mig.start}")
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(uuids),
        "GPULEDGER_CLAIM": f"{allocation.ref.namespace}/{allocation.ref.name}",
        "GPULEDGER_CLAIM_UID": allocation.ref.uid,
        "GPULEDGER_MEMORY_LIMIT_MIB": ",".join(memory),
        "GPULEDGER_CORE_LIMIT_PERCENT": ",".join(compute),
        "GPULEDGER_EXCLUSIVE": "false" if shared else "true",
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
    }
    if placements:
        env["GPULEDGER_MIG"] = ",".join(placements)
    shared_edits: dict[str, Any] = {"deviceNodes": [_device_node(p, device_dir) for p in CONTROL_DEVICES]}
    if allocation.isolation is Isolation.MPS:
        mps = mps or Mps()
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={m}M" for i, m in enumerate(memory))
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(int(c) for c in compute)))
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps.pipe_dir
        mounts = [{"hostPath": mps.host_pipe_dir, "containerPath": mps.pipe_dir, "options": ["rbind", "rw"]}]
        if mps.host_shm_dir:
            mounts.append({"hostPath": mps.host_shm_dir, "containerPath": "/dev/shm", "options": ["rbind", "rw"]})
        shared_edits["mounts"] = mounts
    return {
        "cdiVersion": CDI_VERSION if device_dir == "/dev" else HOST_PATH_VERSION,
        "kind": KIND,
        "devices": devices,
        "containerEdits": {"env": [f"{k}={v}" for k, v in env.items()], **shared_edits},
    }


def _nodes(card: Card, instance: MadeMig | None, minors: MigMinors | None) -> list[str]:
    """The device nodes of a card, or of the MIG instance made on it (its card's, and its
    capabilities' where the minors file is known)."""
    minor = instance.minor if instance is not None and instance.minor is not None else card.minor
    if minor is None:
        return []
    nodes = [f"/dev/nvidia{minor}"]
    if instance is not None and minors is not None:
        nodes += caps(minors, minor, instance)
    return nodes


def _device_node(path: str, device_dir: str) -> dict[str, str]:
    host = on_host(path, device_dir)
    return {"path": path} if host == path else {"path": path, "hostPath": host}


def spec_path(cdi_dir: str, claim_uid: str) -> Path:
    return Path(cdi_dir) / f"{VENDOR}-{CLASS}_{_UNSAFE.sub('-', claim_uid)}.json"


def write(cdi_dir: str, claim_uid: str, content: Mapping[str, Any]) -> Path:
    """Write the spec atomically (a runtime never reads half a file); the same content twice is a no-op."""
    path = spec_path(cdi_dir, claim_uid)
    write_spec(path, content)
    return path


def remove(cdi_dir: str, claim_uid: str) -> bool:
    """Remove the claim's spec; False if there was none (already unprepared)."""
    try:
        spec_path(cdi_dir, claim_uid).unlink()
    except FileNotFoundError:
        return False
    return True


def ids_in(content: Mapping[str, Any]) -> list[str]:
    return [cdi_id(d["name"]) for d in content.get("devices", [])]
