"""A process's pod and container from its /proc/<pid>/cgroup, on the layouts kubelet writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.model import Card
from gpuledger_inventory.attribution import Attributing, attribute
from gpuledger_inventory.cgroups import PodProcess, ProcCgroups, parse_cgroup, pod_of_path
from gpuledger_inventory.health import HealthBook
from gpuledger_inventory.inventory import CardInfo, CardUsage, GpuProcess, Scan, Usage
from gpuledger_inventory.state import NodeState

pytestmark = pytest.mark.timeout(5)

UID = "2f3a6c1e-8b4d-4c1a-9f0e-5d7b2a9c1e44"
UNDERSCORED = UID.replace("-", "_")
CID = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
STATIC = "6b0f8a2c9d1e4f5a8b7c6d5e4f3a2b1c"  # a static pod's uid: a hash without dashes

# Each: the file's text as read on a node, and what it names.
SAMPLES = {
    "v2 systemd containerd burstable": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice/"
        f"cri-containerd-{CID}.scope\n",
        PodProcess(UID, CID),
    ),
    "v2 systemd cri-o besteffort": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}.slice/crio-{CID}.scope\n",
        PodProcess(UID, CID),
    ),
    "v2 systemd guaranteed docker": (
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/docker-{CID}.scope\n",
        PodProcess(UID, CID),
    ),
    "v2 cgroupfs burstable": (f"0::/kubepods/burstable/pod{UID}/{CID}\n", PodProcess(UID, CID)),
    "v2 cgroupfs guaranteed": (f"0::/kubepods/pod{UID}/{CID}\n", PodProcess(UID, CID)),
    "v1 cgroupfs, a line per hierarchy": (
        f"12:hugetlb:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"2:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n"
        "0::/\n",
        PodProcess(UID, CID),
    ),
    "v1 systemd, the unified line empty": (
        f"0::/\n11:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice/"
        f"cri-containerd-{CID}.scope\n",
        PodProcess(UID, CID),
    ),
    "kind: kubelet's cgroup root under /kubelet.slice": (
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope\n",
        PodProcess(UID, CID),
    ),
    "a node in a container (cgroupfs under /docker/<id>)": (
        f"0::/docker/{'a' * 64}/kubepods/burstable/pod{UID}/{CID}\n",
        PodProcess(UID, CID),
    ),
    "read from a private cgroup namespace (relative to the reader's)": (
        f"0::/../../kubepods-burstable-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope\n",
        PodProcess(UID, CID),
    ),
    "a sub-cgroup of the container (systemd inside it)": (
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope/init.scope\n",
        PodProcess(UID, CID),
    ),
    "a static pod (its uid a hash)": (f"0::/kubepods/burstable/pod{STATIC}/{CID}\n", PodProcess(STATIC, CID)),
    "the pod's own cgroup (its sandbox): no container": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice\n",
        PodProcess(UID),
    ),
    "crio's monitor is not the container": (
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/crio-conmon-{CID}.scope\n",
        PodProcess(UID),
    ),
    "a host process": ("0::/system.slice/nvidia-persistenced.service\n", None),
    "a user's shell": ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    "a docker container outside Kubernetes": (f"0::/system.slice/docker-{CID}.scope\n", None),
    "kubepods' own slice": ("0::/kubepods.slice/kubepods-burstable.slice\n", None),
    "empty": ("", None),
}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_cgroup_layouts(name: str) -> None:
    text, expected = SAMPLES[name]
    assert parse_cgroup(text.splitlines()) == expected


def test_a_segment_merely_containing_pod_is_not_a_pod() -> None:
    assert pod_of_path(f"/system.slice/mypod{UID}x.service") is None
    assert pod_of_path(f"/kubepods/burstable/pod{UID[:-1]}/{CID}") is None  # a uid one digit short


def test_upper_case_uid_is_read_as_kubernetes_writes_it() -> None:
    assert pod_of_path(f"/kubepods/pod{UID.upper()}/{CID}") == PodProcess(UID, CID)


def _tree(root: Path, cgroups: dict[int, str]) -> Path:
    for pid, text in cgroups.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return root


def test_proc_reader_reads_under_its_root(tmp_path: Path) -> None:
    proc = ProcCgroups(_tree(tmp_path, {4242: SAMPLES["v2 cgroupfs burstable"][0], 7: "0::/init.scope\n"}))
    assert proc.of(4242) == PodProcess(UID, CID)
    assert proc.of(7) is None
    assert proc.of(99) is None  # gone (or never there): no pod


def test_usage_is_attributed_process_by_process(tmp_path: Path) -> None:
    proc = ProcCgroups(_tree(tmp_path, {10: SAMPLES["v2 cgroupfs guaranteed"][0]}))
    a, b = CardUuid("GPU-a"), CardUuid("GPU-b")
    usage = Usage((CardUsage(a, 300, (GpuProcess(10, 200), GpuProcess(11, 100))), CardUsage(b, 0)))
    found = attribute(usage, proc.of)
    assert found.attributed
    assert found.cards[0].processes == (GpuProcess(10, 200, pod_uid=UID, container_id=CID), GpuProcess(11, 100))
    assert found.cards[1] == usage.cards[1]


class _Gpus:
    backend = "fake"
    nvml = "the fake's module"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def usage(self, scan: Scan) -> Usage:
        return Usage((CardUsage(CardUuid("GPU-a"), 1, (GpuProcess(10, 1),)),))

    def open(self) -> None:
        self.calls.append("open")

    def close(self) -> None:
        self.calls.append("close")

    def scan(self) -> Scan:
        return Scan(())

    def watch(self, scan: Scan) -> dict[str, str]:
        return {}

    def wait(self, timeout_ms: int) -> None:
        return None

    def check(self, uuid: str, reset: bool) -> tuple[str, ...]:
        return ("checked",)


def test_the_wrapper_attributes_usage_and_passes_the_rest_through(tmp_path: Path) -> None:
    inner = _Gpus()
    gpus = Attributing(inner, ProcCgroups(_tree(tmp_path, {10: SAMPLES["v2 cgroupfs guaranteed"][0]})).of)  # type: ignore[arg-type]
    gpus.open()
    gpus.close()
    assert inner.calls == ["open", "close"]
    assert gpus.usage(Scan(())).cards[0].processes[0].pod_uid == UID
    assert gpus.check(CardUuid("GPU-a"), False) == ("checked",)
    assert (gpus.backend, gpus.nvml) == ("fake", "the fake's module")


def test_the_message_names_pods_only_where_processes_are_attributed() -> None:
    state = NodeState(NodeName("n1"), "fake", HealthBook())
    card = Card(CardUuid("GPU-a"), 0, "NVIDIA H100", 81559)
    state.apply_scan(Scan((CardInfo(card),)), 1.0)
    usage = Usage((CardUsage(CardUuid("GPU-a"), 300, (GpuProcess(10, 200), GpuProcess(11, 100))),))
    state.apply_usage(usage, 1.0)
    assert state.message(2.0)["extra"]["cards"][0]["processes"] == [
        {"pid": 10, "used_mib": 200, "mig_uuid": None},
        {"pid": 11, "used_mib": 100, "mig_uuid": None},
    ]  # as from an inventory that does not attribute: a reader falls back to its heuristic
    state.apply_usage(attribute(usage, {10: PodProcess(UID, CID)}.get), 1.0)
    assert state.message(2.0)["extra"]["cards"][0]["processes"] == [
        {"pid": 10, "used_mib": 200, "mig_uuid": None, "pod_uid": UID, "container_id": CID},
        {"pid": 11, "used_mib": 100, "mig_uuid": None, "pod_uid": None, "container_id": None},
    ]
