"""Which pod and container a process belongs to, from its cgroup (docs/audit.md).

NVML names a card's compute processes by host PID. kubelet puts every container in a cgroup whose
path carries the pod's UID and the container's ID, in one of two layouts (its cgroup driver), on
cgroup v1 (a line per hierarchy) or v2 (one ``0::`` line):

- cgroupfs: ``/kubepods/burstable/pod<uid>/<container id>`` (``besteffort``, or none for Guaranteed);
- systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, _ for ->.slice/
  <runtime>-<container id>.scope`` with ``cri-containerd-``, ``crio-`` or ``docker-``.

The path may sit under another root (kind's ``/kubelet.slice/kubelet-kubepods.slice``, a node in a
container, ``/docker/<id>/kubepods``), and a reader in its own cgroup namespace sees it relative to
its own cgroup (``/../../kubepods-…``): so the pod's segment is looked for anywhere in the path, and
the container is the segment right after it. A process in the pod's cgroup itself (the sandbox)
has a pod and no container; crio's ``crio-conmon-<id>.scope`` is the runtime's monitor, not the
container. Nothing else (a host process, a tool outside Kubernetes) names a pod.

``parse_cgroup`` is pure; ``ProcCgroups`` reads ``<proc root>/<pid>/cgroup`` (the host's /proc,
mounted read-only into the inventory's container: NVML's PIDs are the host's).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}|[0-9a-fA-F]{32}"
_POD = re.compile(rf"^(?:[a-z0-9_.-]*-)?pod({_UID})(?:\.slice)?$")
_CONTAINER = re.compile(r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class PodProcess:
    """Where a process runs: its pod's UID and, when it runs in a container, the container's ID."""

    pod_uid: str
    container_id: str | None = None


def pod_of_path(path: str) -> PodProcess | None:
    """The pod (and container) a cgroup path names, or None."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        found = _POD.match(part)
        if found is None:
            continue
        uid = found.group(1).replace("_", "-").lower()
        after = _CONTAINER.match(parts[i + 1]) if i + 1 < len(parts) else None
        return PodProcess(uid, after.group(1) if after else None)
    return None


def parse_cgroup(lines: Iterable[str]) -> PodProcess | None:
    """The pod of a process from the lines of its ``/proc/<pid>/cgroup`` (``id:controllers:path``);
    the first line naming a pod wins (on v1 every hierarchy names the same one)."""
    for line in lines:
        path = line.strip().split(":", 2)[-1]
        found = pod_of_path(path)
        if found is not None:
            return found
    return None


@dataclass(frozen=True, slots=True)
class ProcCgroups:
    """Reads processes' cgroups under ``root`` (``/proc``, or the host's /proc mounted elsewhere)."""

    root: Path

    def of(self, pid: int) -> PodProcess | None:
        """The pod of ``pid``; None for a process gone, unreadable, or in no pod."""
        try:
            text = (self.root / str(pid) / "cgroup").read_text()
        except (OSError, ValueError):
            return None
        return parse_cgroup(text.splitlines())
