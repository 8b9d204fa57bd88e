"""The demo scenario in DRA mode (`gpuledger dev up --kubernetes real --mode dra`), on its own real
control plane: every node's inventory publishes ResourceSlices, every claim is allocated by the real
kube-scheduler and committed by the ledger, every pod runs only after the node's DRA plugin
prepared its claim (the kwok kubelet's DRA side), and its container's environment is the claim's
CDI spec. Afterwards, the ledger holds only claims, each exactly as its ResourceClaim was allocated."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from gpuledger_cli.dev.kubereal import NAMESPACE, RealCluster
from gpuledger_cli.dev.scenario_dra import CLAIMS, run_dra_scenario
from gpuledger_cli.dev.stack import Stack, running_stack
from gpuledger_cli.devup import DEFAULT_FLEET as DEV_FLEET
from gpuledger_common.fleet import Fleet, load_fleet
from gpuledger_common.natsserver import free_port
from gpuledger_core.model import OwnerKind
from tests.e2e.helpers import ledger

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def dra_stack() -> AsyncIterator[Stack]:
    fleet: Fleet = load_fleet(str(DEV_FLEET))
    async with running_stack(fleet, free_port(), free_port(), _say, "real", mode="dra") as running:
        yield running


def _say(message: str) -> None:
    print(f"[e2e dra stack] {message}", flush=True)


@pytest.mark.timeout(420)
async def test_the_demo_scenario_in_dra_mode(dra_stack: Stack) -> None:
    said: list[str] = []
    assert await run_dra_scenario(dra_stack, said.append), "\n".join(said)
    assert any("stays pending" in line for line in said), said
    cluster = dra_stack.cluster
    assert isinstance(cluster, RealCluster) and cluster.api is not None
    claims = (await cluster.api.get(CLAIMS))["items"]
    allocated = {c["metadata"]["uid"]: c for c in claims if c.get("status", {}).get("allocation")}
    held = {a.owner.id: (node, a) for node, found in (await ledger(dra_stack)).items() for a in found.live()}
    assert {owner: node for owner, (node, _) in held.items()} == {
        uid: c["status"]["allocation"]["devices"]["results"][0]["pool"] for uid, c in allocated.items()
    }
    assert all(a.owner.kind is OwnerKind.CLAIM and a.owner.namespace == NAMESPACE for _, a in held.values())
    for uid, (_, entry) in held.items():
        results = allocated[uid]["status"]["allocation"]["devices"]["results"]
        assert sorted(f"gpu-{s.index}" for s in entry.shares()) == sorted(r["device"] for r in results)
