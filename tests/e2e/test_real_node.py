"""A real node: kubelet v1.36.3 and containerd 2 (runc, CNI, CDI) registered with a real control
plane, running real containers from the images built here, and leaving nothing behind when stopped."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuledger_dev.controlplane.build import KUBERNETES
from gpuledger_dev.controlplane.cluster import KWOK_NODE_LABEL, ControlPlane
from gpuledger_dev.realnode.build import CONTAINERD
from gpuledger_dev.realnode.images import WORKLOAD_IMAGE
from gpuledger_dev.realnode.node import RealNode

NAMES = itertools.count()


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    """The session's bare control plane: its kwok plays only the Nodes labelled for it."""
    return control_plane


@pytest.fixture
def node(plane: ControlPlane) -> Iterator[RealNode]:
    """A fresh real node per test (it starts in about two seconds), under a name of its own."""
    with RealNode(plane, name=f"real-{next(NAMES)}") as started:
        yield started
        gone(plane, started.name)
    started.remove_workdir()


def gone(plane: ControlPlane, node: str) -> None:
    """The node's pods deleted at once (the next test's node has another name: none would run them)."""
    on_node = ("--field-selector", f"spec.nodeName={node}")
    plane.kubectl("delete", "pods", *on_node, "--grace-period=0", "--force", "--wait=false")


def pod(name: str, node: RealNode, command: str, restart: str = "Never") -> dict[str, Any]:
    container = {"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", command]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node.name, "restartPolicy": restart, "containers": [container]},
    }


def wait_phase(plane: ControlPlane, name: str, phases: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    found: dict[str, Any] = {}
    while time.monotonic() < deadline:
        found = plane.request("GET", f"/api/v1/namespaces/default/pods/{name}")
        if found.get("status", {}).get("phase") in phases:
            return found
        time.sleep(0.3)
    raise AssertionError(f"pod {name} not in {sorted(phases)} within {timeout:g}s: {found.get('status')}")


def test_kubelet_registers_its_node(node: RealNode) -> None:
    found = node.node()
    assert KWOK_NODE_LABEL[0] not in found["metadata"]["labels"]  # so kwok keeps its hands off
    info = found["status"]["nodeInfo"]
    assert info["kubeletVersion"] == KUBERNETES
    assert info["containerRuntimeVersion"] == f"containerd://{CONTAINERD.removeprefix('v')}"
    addresses = {a["type"]: a["address"] for a in found["status"]["addresses"]}
    assert addresses["InternalIP"] == node.node_ip
    assert found["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == node.kubelet_port


def test_container_runs_and_its_output_reaches_kubectl_logs(plane: ControlPlane, node: RealNode) -> None:
    plane.request("POST", "/api/v1/namespaces/default/pods", pod("hello", node, "echo from-$HOSTNAME; ls /dev"))
    done = wait_phase(plane, "hello", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    logs = plane.kubectl("logs", "hello").stdout.split()
    assert logs[0] == "from-hello"
    assert {"null", "zero", "pts", "shm"} <= set(logs[1:])


def test_exec_reaches_a_running_container(plane: ControlPlane, node: RealNode) -> None:
    plane.request("POST", "/api/v1/namespaces/default/pods", pod("sleeper", node, "sleep 3600", "Always"))
    wait_phase(plane, "sleeper", {"Running"})
    assert plane.kubectl("exec", "sleeper", "--", "sh", "-c", "echo $((6 * 7))").stdout.strip() == "42"


def test_stop_leaves_no_process_mount_or_cgroup(plane: ControlPlane) -> None:
    node = RealNode(plane, name=f"real-{next(NAMES)}")
    with node:
        plane.request("POST", "/api/v1/namespaces/default/pods", pod("left-running", node, "sleep 3600", "Always"))
        wait_phase(plane, "left-running", {"Running"})
        held = node.leftovers()
        kinds = {entry.split()[0] for entry in held}
        assert {"process", "mount", "cgroup", "network", "log"} <= kinds, held
    assert node.leftovers() == []
    node.remove_workdir()


def test_a_runtime_restart_keeps_running_containers_and_the_node_admits_again(
    plane: ControlPlane, node: RealNode
) -> None:
    plane.request("POST", "/api/v1/namespaces/default/pods", pod("survivor", node, "sleep 3600", "Always"))
    before = wait_phase(plane, "survivor", {"Running"})["status"]["containerStatuses"][0]["containerID"]
    node.restart_containerd()
    plane.request("POST", "/api/v1/namespaces/default/pods", pod("newcomer", node, "echo here"))
    assert wait_phase(plane, "newcomer", {"Succeeded", "Failed"})["status"]["phase"] == "Succeeded"
    status = wait_phase(plane, "survivor", {"Running"})["status"]["containerStatuses"][0]
    assert status["containerID"] == before and status["restartCount"] == 0
    assert plane.kubectl("exec", "survivor", "--", "echo", "still-here").stdout.strip() == "still-here"
