"""Device nodes for a fake fleet's cards, so that a real runtime mounts something real.

Each is a character device with ``/dev/null``'s numbers, named as the NVIDIA driver names its
nodes (``nvidia<minor>``, ``nvidiactl``, ``nvidia-uvm``, ``nvidia-uvm-tools``, and for MIG the
capability nodes ``nvidia-caps/nvidia-cap<N>``), made with mknod in a directory of the caller's
(the plugins' ``device_dir``). Production keeps ``/dev``.

The MIG minors file is the driver's ``/proc/driver/nvidia-caps/mig-minors`` (NVIDIA's MIG user
guide, "Device Nodes and Capabilities"): ``config 1``, ``monitor 2``, then for each card, by its
device minor, every GPU instance ID (0-14) with its access and each of its compute instance IDs'
(0-7), numbered in that order (``gpu0/gi0/access 3``, ``gpu0/gi0/ci0/access 4``, ...,
``gpu0/gi1/access 12``). The driver lists every ID whether an instance exists or not; so does this.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
CAPS_DIR = "nvidia-caps"
GPU_INSTANCES, COMPUTE_INSTANCES = 15, 8  # the IDs the driver has capabilities for, per card
PER_GPU_INSTANCE = 1 + COMPUTE_INSTANCES  # its access, then each compute instance's
PER_CARD = GPU_INSTANCES * PER_GPU_INSTANCE
FIRST = 3  # after config (1) and monitor (2)


def make_device_nodes(directory: Path, minors: Iterable[int]) -> list[Path]:
    """Make the control nodes and ``nvidia<minor>`` for each minor under ``directory`` (as root)."""
    return _make(directory, [*CONTROL, *(f"nvidia{minor}" for minor in sorted(set(minors)))])


def mig_minors(card_minors: Iterable[int]) -> dict[str, int]:
    """The MIG minors file's entries for the cards of these device minors (see the module doc)."""
    found = {"config": 1, "monitor": 2}
    for gpu in sorted(set(card_minors)):
        for gi in range(GPU_INSTANCES):
            base = FIRST + gpu * PER_CARD + gi * PER_GPU_INSTANCE
            found[f"gpu{gpu}/gi{gi}/access"] = base
            for ci in range(COMPUTE_INSTANCES):
                found[f"gpu{gpu}/gi{gi}/ci{ci}/access"] = base + 1 + ci
    return found


def make_mig_caps(directory: Path, minors_file: Path, card_minors: Iterable[int]) -> dict[str, int]:
    """Write the MIG minors file of these cards at ``minors_file`` and make every capability node
    it names under ``directory/nvidia-caps`` (as the driver's ``nvidia-modprobe -f`` does)."""
    minors = mig_minors(card_minors)
    minors_file.parent.mkdir(parents=True, exist_ok=True)
    minors_file.write_text("".join(f"{name} {minor}\n" for name, minor in minors.items()))
    _make(directory / CAPS_DIR, [f"nvidia-cap{minor}" for minor in minors.values()])
    return minors


def _make(directory: Path, names: Iterable[str]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    null = os.stat("/dev/null").st_rdev
    made = []
    for name in names:
        path = directory / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, null)
        made.append(path)
    return made
