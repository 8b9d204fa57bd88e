"""With a CDI strategy, Allocate names CDI devices; one that no spec in the runtime's CDI
directories defines is refused before anything is bound, naming it: kubelet would admit the pod
and the runtime fail its container afterwards (containerd: "unresolvable CDI devices")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.model import AllocState
from gpuledger_plugin.answer import AnswerPolicy
from gpuledger_plugin.cdi_specs import CdiSpecs
from gpuledger_plugin.preferred import LocalPlacement
from gpuledger_plugin.service import PluginService

from .plugin_fixtures import SLOTS, ids_of
from .test_plugin_waits import FlakyLedger, NoPods, reserved

pytestmark = pytest.mark.timeout(5)


def spec(directory: Path, name: str, kind: str, *devices: str, as_yaml: bool = False) -> Path:
    body = {"cdiVersion": "0.5.0", "kind": kind, "devices": [{"name": d, "containerEdits": {}} for d in devices]}
    path = directory / name
    if as_yaml:
        lines = ["cdiVersion: '0.5.0'", f"kind: {kind}", "devices:"] + [f"- name: {d}" for d in devices]
        path.write_text("\n".join(lines) + "\n")
    else:
        path.write_text(json.dumps(body))
    return path


def service_of(ledger: FlakyLedger, *dirs: Path, strategy: str = "cdi-cri") -> PluginService:
    policy = AnswerPolicy(strategies=(strategy,), cdi_spec_dirs=tuple(map(str, dirs)))
    return PluginService("n1", ledger, LocalPlacement(), NoPods(), policy, SLOTS)


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
async def test_a_cdi_device_a_spec_defines_is_answered(tmp_path: Path, strategy: str) -> None:
    spec(tmp_path, "nvidia.yaml", "nvidia.com/gpu", "GPU-0", "GPU-3", "all", as_yaml=True)
    ledger = reserved()  # card 3
    outcome = await service_of(ledger, tmp_path / "absent", tmp_path, strategy=strategy).allocate(
        ids_of(ledger.ledger, "p")
    )
    named = list(outcome.answer.cdi_devices) or list(outcome.answer.annotations.values())
    assert named == ["nvidia.com/gpu=GPU-3"]


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
async def test_a_cdi_device_no_spec_defines_is_refused_before_anything_is_bound(tmp_path: Path, strategy: str) -> None:
    spec(tmp_path, "nvidia.json", "nvidia.com/gpu", "GPU-0")  # not card 3
    spec(tmp_path, "other.json", "example.com/gpu", "GPU-3")  # another kind
    (tmp_path / "broken.json").write_text("{not json")  # skipped, as the runtime skips it
    ledger = reserved()
    refused = rf"no CDI spec in {tmp_path} defines the devices nvidia.com/gpu=GPU-3"
    with pytest.raises(FailedPrecondition, match=refused):
        await service_of(ledger, tmp_path, strategy=strategy).allocate(ids_of(ledger.ledger, "p"))
    (allocation,) = ledger.ledger.allocations
    assert allocation.state is AllocState.RESERVED  # nothing bound


def test_the_specs_are_read_again_when_a_file_changes(tmp_path: Path) -> None:
    specs = CdiSpecs([str(tmp_path)])
    assert specs.unresolved(["nvidia.com/gpu=GPU-1"]) == ["nvidia.com/gpu=GPU-1"]
    path = spec(tmp_path, "nvidia.json", "nvidia.com/gpu", "GPU-0", "GPU-1")
    assert specs.unresolved(["nvidia.com/gpu=GPU-1"]) == []
    spec(tmp_path, "nvidia.json", "nvidia.com/gpu", "GPU-0")
    os.utime(path, ns=(1, 1))  # another modification time even where the clock is coarse
    assert specs.unresolved(["nvidia.com/gpu=GPU-1", "nvidia.com/gpu=GPU-0"]) == ["nvidia.com/gpu=GPU-1"]
    path.unlink()
    assert specs.unresolved(["nvidia.com/gpu=GPU-0"]) == ["nvidia.com/gpu=GPU-0"]
