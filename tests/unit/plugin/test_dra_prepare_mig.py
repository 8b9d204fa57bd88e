"""The DRA plugin's Prepare of a MIG placement: the instance made by the node's inventory (for the
claim's ledger allocation), then a CDI spec naming the MIG device, its card's node and its
capability nodes; a placement the inventory does not make fails that claim alone, naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuledger_common.inventory_api import MadeMig
from gpuledger_core import claims
from gpuledger_core.claims import ClaimRef, allocation_of
from gpuledger_core.errors import FailedPrecondition, NotFound
from gpuledger_core.ids import CardUuid, NodeName
from gpuledger_core.model import Card, CardMode, MigSlot, Node
from gpuledger_inventory.slices import SliceConfig, desired, manifest
from gpuledger_plugin.dra import cdi
from gpuledger_plugin.dra.prepare import Preparer

DRIVER = "gpu.gpuledger.io"
NODE = "a100-0"
MIG = "gpu-1-mig-3g-20gb-4"


def published() -> list[dict[str, Any]]:
    """The node's slices as its inventory writes them: card 0 whole, card 1 in MIG mode."""
    cards = (Card(CardUuid("GPU-0"), 0, "NVIDIA A100-SXM4-40GB", 40960, minor=0),
             Card(CardUuid("GPU-1"), 1, "NVIDIA A100-SXM4-40GB", 40960, minor=5, mode=CardMode.MIG))  # fmt: skip
    found = desired(Node(NodeName(NODE), cards), {}, None, SliceConfig())
    return [manifest(found, n, 1) for n in range(found.count)]


def claim(name: str, uid: str, *devices: str) -> dict[str, Any]:
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    status = {"allocation": {"devices": {"results": results}}, "reservedFor": [{"resource": "pods", "uid": "pod-1"}]}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}, "status": status}


class Api:
    def __init__(self, *found: dict[str, Any]) -> None:
        self.claims = {c["metadata"]["name"]: c for c in found}

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        if name not in self.claims:
            raise NotFound(f"ResourceClaim {namespace}/{name}: not found")
        return self.claims[name]

    async def node_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        return published()

    async def close(self) -> None:
        return None


class Maker:
    """The node's inventory: makes what it is asked, or refuses placements of one profile."""

    def __init__(self, refuse: str = "") -> None:
        self.asked: list[tuple[str, MigSlot, str]] = []
        self.refuse = refuse

    async def make(self, card: str, slot: MigSlot, holder: str) -> MadeMig:
        self.asked.append((card, slot, holder))
        if slot.profile == self.refuse:
            raise FailedPrecondition(f"card {card}: {slot.profile} at {slot.start} overlaps another instance")
        return MadeMig(f"MIG-{slot.profile}-{slot.start}", 2, 0, 1, 5)


def test_a_mig_placement_is_read_back_from_the_slices_as_its_card_and_slot() -> None:
    cards = cdi.cards_of(published())
    assert cards["gpu-0"] == cdi.Card("GPU-0", 0, 40960, 0)
    assert cards[MIG] == cdi.Card("GPU-1", 1, 19968, 5, MigSlot("3g.20gb", 4, 4), 42)


async def test_the_instance_is_made_for_the_claims_allocation_and_the_spec_names_it(tmp_path: Path) -> None:
    (tmp_path / "mig-minors").write_text("gpu5/gi2/access 23\ngpu5/gi2/ci0/access 24\nconfig 1\n")
    maker = Maker()
    raw = claim("train", "uid-1", MIG, "gpu-0")
    preparer = Preparer(NODE, DRIVER, Api(raw), str(tmp_path / "cdi"), mig=maker,
                        mig_minors_file=str(tmp_path / "mig-minors"))  # fmt: skip
    ref = ClaimRef("ns", "train", "uid-1")
    found = (await preparer.prepare([ref]))["uid-1"]
    assert found.error == ""
    holder = claims.allocation_id(ref, allocation_of(raw, ref, DRIVER, NODE).devices)
    assert maker.asked == [("GPU-1", MigSlot("3g.20gb", 4, 4), holder)]  # the whole card is not asked for
    spec = json.loads(cdi.spec_path(str(tmp_path / "cdi"), "uid-1").read_text())
    mig_device, card_device = spec["devices"]
    assert mig_device["name"] == f"uid-1-{MIG}"
    nodes = [n["path"] for n in mig_device["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/nvidia5", "/dev/nvidia-caps/nvidia-cap23", "/dev/nvidia-caps/nvidia-cap24"]
    assert [n["path"] for n in card_device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia0"]
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "MIG-3g.20gb-4,GPU-0"
    assert env["GPULEDGER_MEMORY_LIMIT_MIB"] == "19968,40960" and env["GPULEDGER_CORE_LIMIT_PERCENT"] == "42,100"
    assert env["GPULEDGER_MIG"] == "3g.20gb@4" and env["GPULEDGER_EXCLUSIVE"] == "true"
    assert found.devices[0].cdi_ids == (f"k8s.gpu.gpuledger.io/claim=uid-1-{MIG}",)
    again = (await preparer.prepare([ref]))["uid-1"]  # kubelet asks again: the inventory answers as it is
    assert again == found and len(maker.asked) == 2


async def test_without_the_minors_file_the_spec_names_the_cards_node_only(tmp_path: Path) -> None:
    preparer = Preparer(NODE, DRIVER, Api(claim("one", "uid-1", MIG)), str(tmp_path), mig=Maker(),
                        mig_minors_file=str(tmp_path / "absent"))  # fmt: skip
    assert (await preparer.prepare([ClaimRef("ns", "one", "uid-1")]))["uid-1"].error == ""
    (device,) = json.loads(cdi.spec_path(str(tmp_path), "uid-1").read_text())["devices"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia5"]


async def test_a_placement_the_inventory_does_not_make_fails_that_claim_alone(tmp_path: Path) -> None:
    api = Api(claim("bad", "uid-1", MIG), claim("good", "uid-2", "gpu-1-mig-1g-5gb-6"))
    preparer = Preparer(NODE, DRIVER, api, str(tmp_path), mig=Maker(refuse="3g.20gb"),
                        mig_minors_file=str(tmp_path / "absent"))  # fmt: skip
    found = await preparer.prepare([ClaimRef("ns", "bad", "uid-1"), ClaimRef("ns", "good", "uid-2")])
    error = found["uid-1"].error
    assert f"device {MIG}: the node's inventory did not make the MIG instance 3g.20gb at 4 on card 1" in error
    assert "overlaps another instance" in error
    assert not cdi.spec_path(str(tmp_path), "uid-1").exists()
    assert found["uid-2"].error == "" and cdi.spec_path(str(tmp_path), "uid-2").exists()


async def test_a_plugin_without_a_way_to_the_inventory_refuses_a_placement_saying_so(tmp_path: Path) -> None:
    preparer = Preparer(NODE, DRIVER, Api(claim("one", "uid-1", MIG)), str(tmp_path))
    error = (await preparer.prepare([ClaimRef("ns", "one", "uid-1")]))["uid-1"].error
    assert "no connection to the node's inventory" in error and MIG in error
