"""What a real node leaves on the machine while it runs, and what its ``stop`` removes: processes
in its cgroups or naming its work directory (containerd's shims), mounts under the work directory,
its cgroups in every v1 hierarchy, its pod bridge, its links in ``/var/log/containers`` and the
device manager's files in kubelet's fixed device-plugin directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_V1 = Path("/sys/fs/cgroup")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # kubelet's, whatever its --root-dir
CONTAINER_LOGS_DIR = Path("/var/log/containers")  # kubelet links every container's log here


@dataclass
class Residue:
    """The traces of the node whose work directory is ``root``."""

    root: Path
    cgroup_root: str
    bridge: str
    device_plugin_dir: Path = DEVICE_PLUGIN_DIR
    made: list[Path] = field(default_factory=list)  # directories the node made outside ``root``

    def kill_strays(self) -> None:
        for pid in self.stray_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.stray_pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def stray_pids(self) -> list[int]:
        """Processes in this node's cgroups, and containerd shims serving this node's containerd."""
        found: set[int] = set()
        for controller in _controllers():
            top = CGROUP_V1 / controller / self.cgroup_root.lstrip("/")
            if top.is_dir():
                for procs in top.rglob("cgroup.procs"):
                    with contextlib.suppress(OSError):
                        found.update(int(pid) for pid in procs.read_text().split())
        marker = str(self.root).encode()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if marker in (entry / "cmdline").read_bytes():
                        found.add(int(entry.name))
        found.discard(os.getpid())
        return sorted(found)

    def mounts(self) -> list[str]:
        prefix = str(self.root) + "/"
        points = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].replace("\\040", " ")
                if point.startswith(prefix):
                    points.append(point)
        return points

    def unmount_all(self) -> None:
        for _ in range(5):
            points = self.mounts()
            if not points:
                return
            for point in sorted(points, key=len, reverse=True):
                subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)

    def cgroup_dirs(self) -> list[Path]:
        dirs = []
        for controller in _controllers():
            top = CGROUP_V1 / controller / self.cgroup_root.lstrip("/")
            if top.is_dir():
                dirs.extend(sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True))
                dirs.append(top)
        return dirs

    def make_cgroup_root(self) -> None:
        """kubelet wants its ``cgroupRoot`` to exist in every hierarchy; cpuset's starts empty in
        cgroup v1, so it gets its parent's CPUs and memory nodes."""
        for controller in _controllers():
            top = CGROUP_V1 / controller / self.cgroup_root.lstrip("/")
            top.mkdir(exist_ok=True)
            if controller == "cpuset":
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (top / name).write_text((top.parent / name).read_text())

    def remove_cgroups(self) -> None:
        for _ in range(20):
            for directory in self.cgroup_dirs():
                with contextlib.suppress(OSError):
                    directory.rmdir()
            if not self.cgroup_dirs():
                return
            time.sleep(0.2)

    def log_links(self) -> list[Path]:
        if not CONTAINER_LOGS_DIR.is_dir():
            return []
        ours = str(self.root) + "/"
        return [
            link for link in CONTAINER_LOGS_DIR.iterdir() if link.is_symlink() and os.readlink(link).startswith(ours)
        ]

    def remove_fixed_paths(self) -> None:
        """The device manager's files (its socket, its checkpoint, plugin sockets) and our log links;
        the directories too where this node made them."""
        for link in self.log_links():
            link.unlink(missing_ok=True)
        if self.device_plugin_dir.is_dir():
            for entry in self.device_plugin_dir.iterdir():
                if entry.is_socket() or entry.name == "kubelet_internal_checkpoint":
                    entry.unlink(missing_ok=True)
        for directory in reversed(self.made):
            with contextlib.suppress(OSError):
                directory.rmdir()

    def leftovers(self) -> list[str]:
        """What the node still holds on the machine: processes, mounts, cgroups, its bridge, links, kubelet.sock."""
        left = [f"process {pid}: {_cmdline(pid)}" for pid in self.stray_pids()]
        left += [f"mount {point}" for point in self.mounts()]
        left += [f"cgroup {path}" for path in self.cgroup_dirs()]
        if Path("/sys/class/net", self.bridge).exists():
            left.append(f"network interface {self.bridge}")
        left += [f"log link {link}" for link in self.log_links()]
        if (self.device_plugin_dir / "kubelet.sock").exists():
            left.append(f"{self.device_plugin_dir / 'kubelet.sock'}")
        return left


def _controllers() -> list[str]:
    if not CGROUP_V1.is_dir():
        return []
    return sorted(p.name for p in CGROUP_V1.iterdir() if p.is_dir() and not p.is_symlink())


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone)"
