"""Device nodes for a fake fleet's cards, so that a real runtime mounts something real.

Each is a character device with ``/dev/null``'s numbers, named as the NVIDIA driver names its
nodes (``nvidia<minor>``, ``nvidiactl``, ``nvidia-uvm``, ``nvidia-uvm-tools``), made with mknod
in a directory of the caller's (the plugins' ``device_dir``). Production keeps ``/dev``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def make_device_nodes(directory: Path, minors: Iterable[int]) -> list[Path]:
    """Make the control nodes and ``nvidia<minor>`` for each minor under ``directory`` (as root)."""
    directory.mkdir(parents=True, exist_ok=True)
    null = os.stat("/dev/null").st_rdev
    made = []
    for name in (*CONTROL, *(f"nvidia{minor}" for minor in sorted(set(minors)))):
        path = directory / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, null)
        made.append(path)
    return made
