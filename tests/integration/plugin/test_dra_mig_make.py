"""The DRA plugin's Prepare asks the node's inventory over a real nats-server to make a claim's MIG
placement (``mig.make``, answered here by a small responder that plays the inventory): the request
names card, placement and holder; the answer's MIG device is in the CDI spec; the inventory's
refusal, or no inventory at all, fails that claim's prepare with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.inventory_api import MadeMig, mig_make_subject
from gpuledger_core import claims
from gpuledger_core.claims import ClaimRef, allocation_of
from gpuledger_core.errors import FailedPrecondition
from gpuledger_plugin.dra import cdi
from gpuledger_plugin.dra.prepare import Preparer
from gpuledger_plugin.mig_allocate import NatsMigMaker
from tests.unit.plugin.test_dra_prepare_mig import DRIVER, MIG, NODE, Api, claim

pytestmark = pytest.mark.timeout(30)
REF = ClaimRef("ns", "train", "uid-1")


async def test_prepare_makes_the_placement_through_the_nodes_inventory(nc: Client, tmp_path: Path) -> None:
    asked: list[dict[str, Any]] = []

    async def inventory(body: Any) -> Any:
        asked.append(body)
        if body["profile"] != "3g.20gb":
            raise FailedPrecondition(f"card {body['card']}: NVML refused {body['profile']}: Insufficient Resources")
        return MadeMig("MIG-5e1f0000-0000-4000-8000-000000000001", 2, 0, 1, 5).to_json()

    responder = await bus.Responder(nc, mig_make_subject(NODE), inventory).start()
    try:
        raw = claim("train", "uid-1", MIG)
        refused = claim("small", "uid-2", "gpu-1-mig-1g-5gb-6")
        preparer = Preparer(NODE, DRIVER, Api(raw, refused), str(tmp_path), mig=NatsMigMaker(nc, NODE, 5.0),
                            mig_minors_file=str(tmp_path / "absent"))  # fmt: skip
        found = await preparer.prepare([REF, ClaimRef("ns", "small", "uid-2")])
    finally:
        await responder.close()
    assert found["uid-1"].error == ""
    holder = claims.allocation_id(REF, allocation_of(raw, REF, DRIVER, NODE).devices)
    first = {k: v for k, v in asked[0].items() if k != "schema"}
    assert first == {"card": "GPU-1", "profile": "3g.20gb", "start": 4, "size": 4, "holder": holder}
    env = json.loads(cdi.spec_path(str(tmp_path), "uid-1").read_text())["containerEdits"]["env"]
    assert "NVIDIA_VISIBLE_DEVICES=MIG-5e1f0000-0000-4000-8000-000000000001" in env
    assert "NVML refused 1g.5gb: Insufficient Resources" in found["uid-2"].error
    assert "MIG instance 1g.5gb at 6 on card 1 (GPU-1)" in found["uid-2"].error


async def test_with_no_inventory_answering_the_claim_fails_saying_so(nc: Client, tmp_path: Path) -> None:
    preparer = Preparer(NODE, DRIVER, Api(claim("train", "uid-1", MIG)), str(tmp_path),
                        mig=NatsMigMaker(nc, NODE, 2.0))  # fmt: skip
    error = (await preparer.prepare([REF]))["uid-1"].error
    assert f"nobody serves {mig_make_subject(NODE)}" in error
    assert not cdi.spec_path(str(tmp_path), "uid-1").exists()
