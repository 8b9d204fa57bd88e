"""The demo scenario of `gpuledger dev up`, on the real control plane: every pod created through
kube-apiserver, scheduled by kube-scheduler through gpuledger's extender, admitted by the node's
kubelet (Allocate from the plugin shim) and turned Running by kwok."""

from __future__ import annotations

import pytest

from gpuledger_cli.dev.scenario import run_scenario
from gpuledger_cli.dev.stack import Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.timeout(300)
async def test_demo_scenario_on_the_real_control_plane(stack: Stack) -> None:
    said: list[str] = []
    assert await run_scenario(stack, said.append), "\n".join(said)
    assert any("stays pending" in line for line in said), said
