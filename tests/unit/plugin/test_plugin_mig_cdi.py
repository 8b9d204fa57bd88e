"""The CDI spec the plugin writes for a MIG device the runtime's spec does not define: built from
the NVIDIA toolkit's spec of the parent card (its spec-level edits, the card's device node) and
the instance's capability nodes, under the plugin's CDI kind, named by the MIG UUID; not written
where a spec defines the device already, refused without a toolkit spec of the card, and removed
once the instance leaves the node's ledger."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core.errors import FailedPrecondition
from gpuledger_core.model import AllocState, MigInstance, MigSlot, Node
from gpuledger_plugin.answer import AnswerPolicy
from gpuledger_plugin.cdi_specs import CdiSpecs
from gpuledger_plugin.mig_cdi import MigCdi, mig_spec, spec_file

from .test_plugin_mig import mixed_node
from .test_plugin_mig_allocate import PROFILE, FakeInventory, setup, state

pytestmark = pytest.mark.timeout(5)
KIND = "nvidia.com/gpu"
MADE = MadeMig("MIG-GPU-1-0", 7, 0, 1, 11)  # what FakeInventory makes for the reserved 1g.5gb at 0
DRIVER_EDITS: dict[str, Any] = {
    "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
    "mounts": [{"hostPath": "/usr/lib/libcuda.so.550", "containerPath": "/usr/lib/libcuda.so.550"}],
    "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook"]}],
}


def toolkit(directory: Path, *devices: dict[str, Any], version: str = "0.6.0") -> Path:
    """A spec as nvidia-ctk cdi generate writes it: the driver's edits, then the devices."""
    body = {"cdiVersion": version, "kind": KIND, "containerEdits": DRIVER_EDITS, "devices": list(devices)}
    path = directory / "nvidia.json"
    path.write_text(json.dumps(body))
    return path


def card_device(uuid: str = "GPU-1", minor: int = 11) -> dict[str, Any]:
    nodes = [{"path": f"/dev/nvidia{minor}", "permissions": "rw"}, {"path": "/dev/dri/card1"}]
    return {"name": uuid, "containerEdits": {"deviceNodes": nodes}}


def test_the_spec_has_the_toolkits_edits_the_cards_node_and_the_capability_nodes() -> None:
    body = {"cdiVersion": "0.6.0", "kind": KIND, "containerEdits": DRIVER_EDITS}
    caps = ["/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67"]
    spec = mig_spec(body, card_device(), KIND, MADE, "/dev/nvidia11", caps, "/dev")
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == KIND
    assert spec["containerEdits"] == DRIVER_EDITS
    (device,) = spec["devices"]
    assert device["name"] == "MIG-GPU-1-0"
    nodes = device["containerEdits"]["deviceNodes"]
    # the toolkit's own entry for the card's node; not the card's display nodes (a MIG device has none)
    assert nodes == [{"path": "/dev/nvidia11", "permissions": "rw"}, *({"path": p} for p in caps)]


def test_nodes_outside_dev_are_named_by_host_path_in_a_spec_version_that_has_it() -> None:
    body = {"cdiVersion": "0.3.0", "kind": KIND}
    parent = {"name": "GPU-1", "containerEdits": {"env": ["X=1"]}}  # names no device node
    spec = mig_spec(body, parent, KIND, MADE, "/dev/nvidia11", ["/dev/nvidia-caps/nvidia-cap66"], "/run/dev")
    assert spec["cdiVersion"] == "0.5.0" and "containerEdits" not in spec
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia11", "hostPath": "/run/dev/nvidia11"},
        {"path": "/dev/nvidia-caps/nvidia-cap66", "hostPath": "/run/dev/nvidia-caps/nvidia-cap66"},
    ]


def policy_for(directory: Path, strategy: str = "cdi-cri") -> AnswerPolicy:
    return AnswerPolicy(strategies=(strategy,), cdi_spec_dirs=(str(directory),))


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
async def test_allocate_writes_the_spec_of_an_instance_made_on_demand(tmp_path: Path, strategy: str) -> None:
    toolkit(tmp_path, card_device("GPU-0", 10), card_device())
    minors = tmp_path / "mig-minors"
    minors.write_text("config 1\nmonitor 2\ngpu11/gi7/access 66\ngpu11/gi7/ci0/access 67\n")
    ledger, service = setup(FakeInventory(), policy_for(tmp_path, strategy))
    service.mig.minors_file = str(minors)
    await service._seen(ledger.ledger)
    outcome = await service.allocate(["GPU-1::0"], service.accepts(PROFILE))
    named = list(outcome.answer.cdi_devices) or list(outcome.answer.annotations.values())
    assert named == ["nvidia.com/gpu=MIG-GPU-1-0"]
    written = json.loads((tmp_path / "gpuledger-mig-MIG-GPU-1-0.json").read_text())
    assert written["kind"] == KIND and written["containerEdits"] == DRIVER_EDITS
    (device,) = written["devices"]
    assert device["name"] == "MIG-GPU-1-0"
    paths = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    assert paths == ["/dev/nvidia11", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67"]
    assert state(ledger)[0] is AllocState.BOUND


async def test_without_a_toolkit_spec_of_the_card_the_container_is_refused_naming_it(tmp_path: Path) -> None:
    toolkit(tmp_path, card_device("GPU-0", 10))  # another card only
    ledger, service = setup(FakeInventory(), policy_for(tmp_path))
    await service._seen(ledger.ledger)
    with pytest.raises(FailedPrecondition) as caught:
        await service.allocate(["GPU-1::0"], service.accepts(PROFILE))
    message = str(caught.value)
    assert f"no CDI spec in {tmp_path} defines the card nvidia.com/gpu=GPU-1" in message, message
    assert "MIG-GPU-1-0" in message and "MIG instance 1g.5gb at 0 on card 1 (GPU-1)" in message
    assert not ours_in(tmp_path)
    assert state(ledger)[0] is AllocState.RELEASED


async def test_an_instance_a_spec_defines_gets_no_spec_of_ours_and_a_stale_one_goes(tmp_path: Path) -> None:
    """The toolkit listed the instance (a static one, or it ran again): two specs of a directory
    defining one device would be a conflict the runtime refuses."""
    toolkit(tmp_path, card_device(), {"name": "MIG-GPU-1-0", "containerEdits": {}})
    ours = tmp_path / spec_file("MIG-GPU-1-0")
    ours.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": KIND, "devices": [{"name": "MIG-GPU-1-0"}]}))
    ledger, service = setup(FakeInventory(), policy_for(tmp_path))
    await service._seen(replace(ledger.ledger, node=with_instances(ledger.ledger.node, "MIG-GPU-1-0")))
    outcome = await service.allocate(["GPU-1::0"], service.accepts(PROFILE))
    assert outcome.answer.cdi_devices == ("nvidia.com/gpu=MIG-GPU-1-0",)
    assert not ours.exists()


def ours_in(directory: Path) -> list[Path]:
    return list(directory.glob("gpuledger-mig-*"))


def with_instances(node: Node, *uuids: str) -> Node:
    """The node with card 1 holding a 1g.5gb instance of each MIG UUID (at 0, 1, ...)."""
    card = node.cards[1]
    instances = tuple(MigInstance(MigSlot("1g.5gb", i, 1), False, u) for i, u in enumerate(uuids))
    return replace(node, cards=(node.cards[0], replace(card, instances=instances), *node.cards[2:]))


def spec_of(directory: Path, uuid: str) -> Path:
    path = directory / spec_file(uuid)
    path.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": KIND, "devices": [{"name": uuid}]}))
    return path


def test_a_spec_goes_once_its_instance_leaves_the_ledger(tmp_path: Path) -> None:
    mig_cdi = MigCdi(CdiSpecs([str(tmp_path)]), KIND, "/dev")
    toolkit(tmp_path, card_device())
    mig_cdi.ensure("GPU-1", MADE, "/dev/nvidia11", [])
    ours = tmp_path / spec_file(MADE.uuid)
    node = mixed_node()
    mig_cdi.follow(node)
    assert ours.exists()  # written before the inventory's scan reached the ledger
    mig_cdi.follow(with_instances(node, MADE.uuid))
    assert ours.exists()  # the instance lives (held, or within the inventory's keep)
    mig_cdi.follow(node)
    assert not ours.exists()  # destroyed
    assert (tmp_path / "nvidia.json").exists()  # the toolkit's is never touched


def test_specs_left_from_before_go_unless_their_instance_is_there(tmp_path: Path) -> None:
    gone, kept = spec_of(tmp_path, "MIG-gone"), spec_of(tmp_path, "MIG-kept")
    (tmp_path / "gpuledger-mig-broken.json").write_text("{")
    MigCdi(CdiSpecs([str(tmp_path)]), KIND, "/dev").follow(with_instances(mixed_node(), "MIG-kept"))
    assert not gone.exists() and kept.exists()
    assert (tmp_path / "gpuledger-mig-broken.json").exists()  # not ours to judge: left alone
