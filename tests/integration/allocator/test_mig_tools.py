"""A tool's MIG request through the allocator's NATS API (``fit.fit_node`` routes it to
``mig_fit.fit_mig``): an instance on the node's card in MIG mode, a refusal naming the profile where
no card is in MIG mode, and a plain card request never put on a card in MIG mode."""

from __future__ import annotations

import pytest
from nats.aio.client import Client

from gpuledger_common import bus
from gpuledger_common.announce import announce
from gpuledger_core.errors import Exhausted
from tests.integration.placement.helpers import MIG_NODE, mig_node
from tests.support.replicas import RunningAllocator, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
SUBJECT = "gpuledger.v1.allocator"


def body(owner: str, **request: object) -> dict[str, object]:
    return {"owner": {"kind": "tool", "id": owner}, "containers": [{"container": "", "request": request}]}


@pytest.fixture
async def announced(allocator: RunningAllocator, nc: Client) -> RunningAllocator:
    await announce(nc, [mig_node()])

    async def known() -> bool:
        cluster = await bus.request(nc, f"{SUBJECT}.cluster", {})
        return any(n["name"] == MIG_NODE for n in cluster["nodes"])

    await wait_for(known, what="the MIG node in the ledger")
    return allocator


async def test_a_tool_gets_a_mig_instance_on_the_card_in_mig_mode(announced: RunningAllocator, nc: Client) -> None:
    result = await bus.request(nc, f"{SUBJECT}.allocate", body("t-mig", count=1, mig="1g.10gb"))
    allocation = result["allocation"]
    [grant] = allocation["grants"]
    [share] = grant["cards"]
    assert (allocation["node"], share["index"], share["mig"]["profile"]) == (MIG_NODE, 0, "1g.10gb")
    smallest = await bus.request(nc, f"{SUBJECT}.allocate", body("t-small", count=1, mem_mib=8000, mig="smallest"))
    [[share]] = [g["cards"] for g in smallest["allocation"]["grants"]]
    assert share["mig"]["profile"] == "1g.10gb" and share["mig"] != allocation["grants"][0]["cards"][0]["mig"]


async def test_no_card_in_mig_mode_is_refused_naming_the_profile(announced: RunningAllocator, nc: Client) -> None:
    with pytest.raises(Exhausted, match=r"no card in MIG mode for MIG 1g\.10gb"):
        await bus.request(nc, f"{SUBJECT}.allocate", body("t-h100", count=1, mig="1g.10gb", models=["H100"]))


async def test_a_whole_card_request_is_never_put_on_a_card_in_mig_mode(announced: RunningAllocator, nc: Client) -> None:
    with pytest.raises(Exhausted, match=r"1 healthy card\(s\) of the 2 needed \(1 other\(s\) in MIG mode"):
        await bus.request(nc, f"{SUBJECT}.allocate", {**body("t-whole", count=2), "node": MIG_NODE})
