"""Allocate for a container holding MIG instances: the node's inventory makes each instance (or
answers the one that is there), then the container is answered with them (``mig_answer``).

The grant is found and bound as any other (``service``); its instances are made after the bind,
on the cards and placements the bound grant holds, so that the ledger holds them while they are
made (the inventory destroys an on-demand instance no live allocation holds). Making asks
``gpuledger.v1.inventory.<node>.mig.make`` (``inventory_api.make_mig``) once per instance, the
allocation's id as the holder.

Where the answer names the instances as CDI devices (``cdi-cri``, ``cdi-annotations``), each is
given a CDI spec of the plugin's own unless one the runtime reads defines it already
(``mig_cdi``: the NVIDIA toolkit's spec lists only the instances that existed when it ran).

When an instance cannot be made, or the answer could not be applied (device nodes or CDI devices
the node lacks), Allocate fails with the reason, which kubelet shows in the pod's status, and the
allocation is released in the ledger with a reason naming card and profile: nothing stays held
for a pod that cannot start. A call cut short by its time limit while making releases it too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from nats.aio.client import Client

from gpuledger_common.inventory_api import MAKE_TIMEOUT_S, MadeMig, make_mig
from gpuledger_core.errors import FailedPrecondition, GpuledgerError, NotFound
from gpuledger_core.ledger import NodeLedger, release
from gpuledger_core.mig import placement_text
from gpuledger_core.model import Allocation, CardShare, Grant, MigSlot, Node
from gpuledger_plugin.answer import Answer, AnswerPolicy
from gpuledger_plugin.appliable import unappliable
from gpuledger_plugin.cdi_specs import CdiSpecs
from gpuledger_plugin.ledger_port import NodeLedgerPort
from gpuledger_plugin.metrics import MIG_MADE
from gpuledger_plugin.mig_answer import MIG_MINORS_FILE, MigMinors, instance_nodes, mig_answer, read_mig_minors
from gpuledger_plugin.mig_cdi import MigCdi

log = logging.getLogger(__name__)


class MigMaker(Protocol):
    async def make(self, card: str, slot: MigSlot, holder: str) -> MadeMig: ...


class NatsMigMaker:
    """The node's inventory, over NATS, as the plugin's user (``plugin-<node>`` may ask its own node)."""

    def __init__(self, nc: Client, node: str, timeout_s: float = MAKE_TIMEOUT_S) -> None:
        self.nc, self.node, self.timeout_s = nc, node, timeout_s

    async def make(self, card: str, slot: MigSlot, holder: str) -> MadeMig:
        return await make_mig(self.nc, self.node, card, slot, holder, self.timeout_s)


class Unmade:
    """A plugin with no way to ask the inventory (tests of whole cards): every instance refused."""

    async def make(self, card: str, slot: MigSlot, holder: str) -> MadeMig:
        raise FailedPrecondition("this plugin has no connection to the node's inventory to make MIG instances")


def describe(share: CardShare) -> str:
    """``MIG instance 1g.10gb at 6 on card 0 (GPU-...)``."""
    if share.mig is None:
        return f"MIG instance (no placement) on card {share.index} ({share.uuid})"
    return placement_text(share.mig, share.index, share.uuid)


class MigAllocate:
    def __init__(
        self,
        maker: MigMaker,
        ledger: NodeLedgerPort,
        policy: AnswerPolicy,
        cdi: CdiSpecs,
        minors_file: str = MIG_MINORS_FILE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.maker, self.ledger, self.policy, self.cdi = maker, ledger, policy, cdi
        self.mig_cdi = MigCdi(cdi, policy.cdi_kind, policy.device_dir)
        self.minors_file, self.clock = minors_file, clock
        self._releases: set[asyncio.Task[None]] = set()

    async def answer(self, node: Node, allocation: Allocation, grant: Grant, release_on_failure: bool = True) -> Answer:
        """The instances of ``grant`` made, and the container's answer; ``FailedPrecondition``
        with the reason otherwise, the allocation released first (``release_on_failure``)."""
        try:
            made = await self._make_all(allocation, grant.cards)
            planned = self._planned(node, allocation, grant, made)
        except _Failed as failed:
            MIG_MADE.labels("failed").inc()
            if release_on_failure:
                await self._release(allocation, failed.reason)
            raise FailedPrecondition(failed.reason) from failed.__cause__
        except asyncio.CancelledError:
            if release_on_failure:  # cut short by the call's time limit: nothing may stay held
                self._release_later(
                    allocation, f"{allocation.owner.describe()}: Allocate ran out of time making MIG instances"
                )
            raise
        MIG_MADE.labels("made").inc(len(made))
        return planned

    async def _make_all(self, allocation: Allocation, shares: Sequence[CardShare]) -> list[MadeMig]:
        made = []
        for share in shares:
            if share.mig is None:
                raise _Failed(f"{allocation.owner.describe()}: card {share.index} ({share.uuid}) holds no MIG instance")
            try:
                instance = await self.maker.make(share.uuid, share.mig, allocation.id)
            except GpuledgerError as err:
                raise _Failed(f"{describe(share)} could not be made for {allocation.owner.describe()}: {err}") from err
            log.info(
                "%s is %s (GPU instance %d, compute instance %d) for %s",
                describe(share),
                instance.uuid,
                instance.gpu_instance,
                instance.compute_instance,
                allocation.owner.describe(),
                extra={"allocation": allocation.id},
            )
            made.append(instance)
        return made

    def _planned(self, node: Node, allocation: Allocation, grant: Grant, made: list[MadeMig]) -> Answer:
        who = allocation.owner.describe()
        profiles = ", ".join(describe(s) for s in grant.cards)
        try:
            minors = read_mig_minors(self.minors_file) if self.policy.names_devices else None
            planned = mig_answer(node, allocation, grant, made, self.policy, minors)
            if planned.cdi_devices or planned.annotations:
                self._describe(node, grant, made, minors)
        except GpuledgerError as err:
            raise _Failed(f"{who}: {profiles}: {err}") from err
        problem = unappliable(planned, self.policy, self.cdi)
        if problem:
            raise _Failed(f"{who}: {profiles}: {problem}")
        return planned

    def _describe(self, node: Node, grant: Grant, made: list[MadeMig], minors: MigMinors | None) -> None:
        """Every named MIG device defined by a CDI spec the runtime reads (``mig_cdi``)."""
        for index, instance in enumerate(made):
            card_node, capabilities = instance_nodes(node, grant, index, instance, minors)
            self.mig_cdi.ensure(grant.cards[index].uuid, instance, card_node, capabilities)

    async def _release(self, allocation: Allocation, reason: str) -> None:
        now = self.clock()

        def released(ledger: NodeLedger | None) -> NodeLedger:
            if ledger is None:
                raise NotFound("this node has no ledger entry")
            return release(ledger, allocation.id, now, reason)

        try:
            await self.ledger.mutate(released)
        except GpuledgerError as err:
            log.error("could not release %s after its MIG instances failed: %s", allocation.id, err)
            return
        log.warning("released %s: %s", allocation.id, reason, extra={"allocation": allocation.id})

    def _release_later(self, allocation: Allocation, reason: str) -> None:
        task = asyncio.get_running_loop().create_task(self._release(allocation, reason))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)


class _Failed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
