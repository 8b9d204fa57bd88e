"""The DRA plugin's own parts: reading a claim's allocation, the CDI spec per claim, and the
preparer answering claim by claim (the API server behind a small in-memory stand-in)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gpuledger_core.claims import AllocatedDevice, ClaimAllocation, ClaimRef, allocation_of
from gpuledger_core.errors import FailedPrecondition, NotFound
from gpuledger_core.model import Isolation
from gpuledger_core.quantity import whole_up
from gpuledger_plugin.dra import cdi
from gpuledger_plugin.dra.prepare import Preparer
from gpuledger_plugin.dra.settings import DraSettings, wants_dra

DRIVER = "gpu.gpuledger.io"
NODE = "h100-0"
REF = ClaimRef("ns", "share", "uid-1")


def claim(
    results: list[dict[str, Any]], uid: str = "uid-1", reserved: bool = True, name: str = "share"
) -> dict[str, Any]:
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}} if results else {}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "app", "uid": "pod-1"}]
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}, "status": status}


def result(device: str = "gpu-0", pool: str = NODE, driver: str = DRIVER, **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": driver, "pool": pool, "device": device, **extra}


SHARE = result(shareID="s-1", consumedCapacity={"memory": "10Gi", "compute": "25", "slots": "1"})


@pytest.mark.parametrize(("raw", "value"), [("10Gi", 10 << 30), ("25", 25), ("1500m", 2), ("1k", 1000), (3, 3)])
def test_quantities_are_read_rounded_up(raw: Any, value: int) -> None:
    assert whole_up(raw, "x") == value


def test_the_devices_of_our_driver_on_this_node_are_taken() -> None:
    raw = claim([SHARE, result("gpu-1", pool="other"), result("nic-0", driver="net.example.com")])
    found = allocation_of(raw, REF, DRIVER, NODE)
    assert found.devices == (AllocatedDevice("gpu", NODE, "gpu-0", "s-1", 10 << 30, 25, chosen="gpu"),)
    assert found.pods == ("pod-1",)


def test_a_first_available_choice_answers_for_its_main_request() -> None:
    found = allocation_of(claim([{**SHARE, "request": "gpus/linked"}]), REF, DRIVER, NODE)
    assert found.devices[0].request == "gpus"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (claim([SHARE], uid="uid-2"), "uid uid-2"),
        (claim([]), "is not allocated"),
        (claim([SHARE], reserved=False), "reserved for no pod"),
        (claim([result(pool="h100-1")]), "device on node h100-0 (its gpu.gpuledger.io devices are in pools h100-1)"),
        (claim([result(driver="net.example.com")]), "no gpu.gpuledger.io device on node h100-0"),
    ],
)
def test_a_claim_we_cannot_serve_is_refused_saying_why(raw: dict[str, Any], problem: str) -> None:
    with pytest.raises(FailedPrecondition, match=problem.replace("(", r"\(").replace(")", r"\)")):
        allocation_of(raw, REF, DRIVER, NODE)


CARDS = {"gpu-0": cdi.Card("GPU-a", 0, 81920, 0), "gpu-1": cdi.Card("GPU-b", 1, 81920, 1)}


def test_the_cdi_spec_gives_each_device_a_unique_name_its_node_and_the_claims_limits() -> None:
    shared = AllocatedDevice("gpu", NODE, "gpu-0", "s-1", 10 << 30, 25)
    whole = AllocatedDevice("gpu", NODE, "gpu-1")
    content = cdi.spec(ClaimAllocation(REF, (shared, whole), ("pod-1",)), CARDS)
    assert content["kind"] == "k8s.gpu.gpuledger.io/claim"
    assert [d["name"] for d in content["devices"]] == ["uid-1-gpu-0-s-1", "uid-1-gpu-1"]
    assert content["devices"][1]["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia1"}]}
    env = dict(e.split("=", 1) for e in content["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert env["GPULEDGER_MEMORY_LIMIT_MIB"] == "10240,81920"
    assert env["GPULEDGER_CORE_LIMIT_PERCENT"] == "25,100"
    assert env["GPULEDGER_EXCLUSIVE"] == "false"
    assert env["GPULEDGER_CLAIM"] == "ns/share"
    assert cdi.ids_in(content) == [
        "k8s.gpu.gpuledger.io/claim=uid-1-gpu-0-s-1",
        "k8s.gpu.gpuledger.io/claim=uid-1-gpu-1",
    ]


def test_device_nodes_outside_dev_are_named_as_host_paths_of_a_cdi_version_that_has_them() -> None:
    whole = AllocatedDevice("gpu", NODE, "gpu-1")
    content = cdi.spec(ClaimAllocation(REF, (whole,), ("pod-1",)), CARDS, device_dir="/run/fake-dev")
    assert content["cdiVersion"] == "0.5.0"
    assert content["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "hostPath": "/run/fake-dev/nvidia1"}
    ]
    assert {"path": "/dev/nvidiactl", "hostPath": "/run/fake-dev/nvidiactl"} in content["containerEdits"]["deviceNodes"]
    assert cdi.spec(ClaimAllocation(REF, (whole,), ("pod-1",)), CARDS)["cdiVersion"] == "0.3.0"


def test_an_mps_claim_is_an_mps_client_limited_per_cuda_ordinal_and_an_unisolated_one_is_not() -> None:
    a = AllocatedDevice("gpu", NODE, "gpu-0", "s-1", 10 << 30, 25)
    b = AllocatedDevice("gpu", NODE, "gpu-1", "s-2", 4 << 30, 40)
    mps = cdi.Mps("/tmp/nvidia-mps", "/run/nvidia/mps", "/run/nvidia/mps-shm")
    content = cdi.spec(ClaimAllocation(REF, (a, b), ("pod-1",), Isolation.MPS), CARDS, mps)
    env = dict(e.split("=", 1) for e in content["containerEdits"]["env"])
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"  # ordinal i is the claim's i-th card
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M,1=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert content["containerEdits"]["mounts"] == [
        {"hostPath": "/run/nvidia/mps", "containerPath": "/tmp/nvidia-mps", "options": ["rbind", "rw"]},
        {"hostPath": "/run/nvidia/mps-shm", "containerPath": "/dev/shm", "options": ["rbind", "rw"]},
    ]
    plain = cdi.spec(ClaimAllocation(REF, (a, b), ("pod-1",)), CARDS, mps)
    assert not [e for e in plain["containerEdits"]["env"] if e.startswith("CUDA_MPS_")]
    assert "mounts" not in plain["containerEdits"]


def test_a_device_that_is_not_published_here_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="gpu-7 is not published"):
        cdi.spec(ClaimAllocation(REF, (AllocatedDevice("gpu", NODE, "gpu-7"),), ("p",)), CARDS)


def test_cards_are_read_back_from_the_published_slices() -> None:
    device = {
        "name": "gpu-3",
        "attributes": {
            "uuid": {"string": "GPU-d"},
            "index": {"int": 3},
            "memoryMiB": {"int": 24576},
            "minor": {"int": 5},
        },
    }
    assert cdi.cards_of([{"spec": {"devices": [device]}}]) == {"gpu-3": cdi.Card("GPU-d", 3, 24576, 5)}


class Claims:
    """The API server's claims by name (a claim that raises stands for an unanswering server)."""

    def __init__(self, claims: dict[str, Any]) -> None:
        self.claims = claims

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.claims.get(name)
        if found is None:
            raise NotFound(f"ResourceClaim {namespace}/{name}: not found")
        if found == "hang":
            await asyncio.sleep(60)
        return dict(found)

    async def node_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        attrs = [
            {"uuid": {"string": f"GPU-{i}"}, "index": {"int": i}, "memoryMiB": {"int": 81920}, "minor": {"int": i}}
            for i in range(2)
        ]
        devices = [{"name": f"gpu-{i}", "attributes": a} for i, a in enumerate(attrs)]
        return [{"spec": {"devices": devices}}]

    async def close(self) -> None:
        return None


async def test_each_claim_is_answered_on_its_own_and_prepare_is_idempotent(tmp_path: Path) -> None:
    other = claim([result(pool="x")], uid="uid-3", name="other")
    api = Claims({"share": claim([SHARE]), "late": "hang", "other": other})
    preparer = Preparer(NODE, DRIVER, api, str(tmp_path), timeout_s=3.0)
    refs = [REF, ClaimRef("ns", "gone", "uid-0"), ClaimRef("ns", "late", "uid-2"), ClaimRef("ns", "other", "uid-3")]
    found = await preparer.prepare(refs)
    assert set(found) == {"uid-1", "uid-0", "uid-2", "uid-3"}
    assert found["uid-1"].error == ""
    assert found["uid-1"].devices[0].cdi_ids == ("k8s.gpu.gpuledger.io/claim=uid-1-gpu-0-s-1",)
    assert "not found" in found["uid-0"].error
    assert "within 3s" in found["uid-2"].error
    assert "no gpu.gpuledger.io device on node h100-0" in found["uid-3"].error
    spec = cdi.spec_path(str(tmp_path), "uid-1")
    first = spec.read_text()
    assert json.loads(first)["devices"][0]["name"] == "uid-1-gpu-0-s-1"
    assert _names(tmp_path) == [spec.name]  # nothing for the refused claims
    again = await preparer.prepare([REF])
    assert again["uid-1"] == found["uid-1"] and spec.read_text() == first
    gone = await preparer.unprepare([REF, ClaimRef("ns", "never", "uid-9")])
    assert gone["uid-1"].error == "" and gone["uid-9"].error == ""
    assert not spec.exists()


async def test_concurrent_prepares_of_one_claim_write_one_spec_one_at_a_time(tmp_path: Path) -> None:
    preparer = Preparer(NODE, DRIVER, Claims({"share": claim([SHARE])}), str(tmp_path), timeout_s=10)
    answers = await asyncio.gather(*(preparer.prepare([REF]) for _ in range(5)))
    assert all(a["uid-1"] == answers[0]["uid-1"] and not a["uid-1"].error for a in answers)
    assert _names(tmp_path) == [cdi.spec_path(str(tmp_path), "uid-1").name]
    assert preparer._locks == {}  # nothing kept once every call is answered


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_dra_mode_refuses_bad_settings_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuledger_plugin.__main__ import main

    assert main(["--mode", "dra", "--cdi-dir", "relative"]) == 2
    assert "node" in capsys.readouterr().err
    assert main(["--mode", "dra", "--node", "n", "--cdi-dir", "relative"]) == 2
    assert "cdi_dir: must be an absolute path" in capsys.readouterr().err


def test_dra_mode_is_chosen_by_flag_or_environment() -> None:
    assert wants_dra(["--mode", "dra", "--node", "n"], {})
    assert wants_dra(["--mode=dra"], {})
    assert not wants_dra(["--mode", "classic"], {"GPULEDGER_MODE": "dra"})
    assert wants_dra([], {"GPULEDGER_MODE": "dra"})
    assert not wants_dra([], {})
    settings = DraSettings(node="n")
    assert settings.registration_socket == "/var/lib/kubelet/plugins_registry/gpu.gpuledger.io-reg.sock"
    assert settings.dra_socket == "/var/lib/kubelet/plugins/gpu.gpuledger.io/dra.sock"
