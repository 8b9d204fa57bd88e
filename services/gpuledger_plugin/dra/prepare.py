"""NodePrepareResources and NodeUnprepareResources, claim by claim (no wire types here).

Prepare reads each claim from the API server (kubelet's word is not enough: the claim must be
allocated, the same object, reserved for a pod, and hold devices of our driver on this node),
asks the ledger seam, and writes the claim's CDI spec; Unprepare removes it. Each claim is answered
on its own: one that fails never fails the others. Both are idempotent (the spec on disk is what
was prepared, so a restarted plugin unprepares what an earlier one prepared, even when the claim
is gone from the API server), one claim at a time per UID, and bounded by ``timeout_s``.

A MIG placement is made before the spec is written (``dra.mig``: the node's inventory makes the
instance; the spec names its MIG device). Unprepare leaves the instance: the inventory destroys an
on-demand instance once no allocation in the ledger holds it (docs/mig.md).

The ledger seam (``LedgerCheck``): ``ledger.LedgerEntryCheck`` refuses a claim the node's ledger
does not hold (placement's claims controller writes the entries); ``Unchecked`` (``ledger_check``
off) accepts what kube-scheduler allocated.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuledger_core.claims import AllocatedDevice, ClaimAllocation, ClaimRef, allocation_of
from gpuledger_core.errors import GpuledgerError
from gpuledger_plugin.dra import cdi
from gpuledger_plugin.dra.kube import ClaimApi
from gpuledger_plugin.dra.metrics import CLAIM_SECONDS, CLAIMS
from gpuledger_plugin.dra.mig import made_for
from gpuledger_plugin.mig_allocate import MigMaker, Unmade
from gpuledger_plugin.mig_answer import MIG_MINORS_FILE, read_mig_minors

log = logging.getLogger(__name__)


class LedgerCheck(Protocol):
    async def check(self, allocation: ClaimAllocation) -> None:
        """Refuse (raise a GpuledgerError) an allocation the ledger does not hold."""

    async def release(self, claim_uid: str) -> None:
        """The claim is unprepared on this node."""


class Unchecked:
    """``ledger_check`` off: every allocation kube-scheduler made is accepted."""

    async def check(self, allocation: ClaimAllocation) -> None:
        log.debug("%s: not checked against the ledger (ledger_check is off)", allocation.ref.describe())

    async def release(self, claim_uid: str) -> None:
        return None


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    device: AllocatedDevice
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One claim's answer: its devices, or why not."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class Preparer:
    def __init__(
        self,
        node: str,
        driver: str,
        api: ClaimApi,
        cdi_dir: str,
        ledger: LedgerCheck | None = None,
        timeout_s: float = 30.0,
        mps: cdi.Mps | None = None,
        device_dir: str = "/dev",
        mig: MigMaker | None = None,
        mig_minors_file: str = MIG_MINORS_FILE,
    ) -> None:
        self.node, self.driver, self.api, self.cdi_dir = node, driver, api, cdi_dir
        self.device_dir = device_dir
        self.mig, self.mig_minors_file = mig or Unmade(), mig_minors_file
        self.ledger = ledger or Unchecked()
        self.timeout_s = timeout_s
        self.mps = mps or cdi.Mps()
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # per claim UID: the lock, its users

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        outcomes = await asyncio.gather(*(self._bounded(ref, self._prepare, "prepare") for ref in refs))
        return {ref.uid: outcome for ref, outcome in zip(refs, outcomes, strict=True)}

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        outcomes = await asyncio.gather(*(self._bounded(ref, self._unprepare, "unprepare") for ref in refs))
        return {ref.uid: outcome for ref, outcome in zip(refs, outcomes, strict=True)}

    async def _bounded(self, ref: ClaimRef, work: _Work, what: str) -> Outcome:
        started = time.perf_counter()
        outcome = await self._answer(ref, work, what)
        CLAIM_SECONDS.labels(what).observe(time.perf_counter() - started)
        CLAIMS.labels(what, "error" if outcome.error else "ok").inc()
        return outcome

    async def _answer(self, ref: ClaimRef, work: _Work, what: str) -> Outcome:
        lock, users = self._locks.get(ref.uid, (asyncio.Lock(), 0))
        self._locks[ref.uid] = (lock, users + 1)
        try:
            async with asyncio.timeout(self.timeout_s):
                async with lock:
                    return await work(ref)
        except TimeoutError:
            error = f"cannot {what} {ref.describe()} within {self.timeout_s:g}s (the API server is not answering)"
        except GpuledgerError as err:
            error = f"cannot {what} {ref.describe()}: {err}"
        except Exception as err:  # a claim must get an answer whatever broke
            log.exception("%s of %s failed", what, ref.describe())
            error = f"cannot {what} {ref.describe()}: {type(err).__name__}: {err}"
        finally:
            lock, users = self._locks[ref.uid]
            if users == 1:
                del self._locks[ref.uid]
            else:
                self._locks[ref.uid] = (lock, users - 1)
        log.warning("gpuledger-plugin on node %s: %s", self.node, error)
        return Outcome(error=error)

    async def _prepare(self, ref: ClaimRef) -> Outcome:
        raw = await self.api.get_claim(ref.namespace, ref.name)
        allocation = allocation_of(raw, ref, self.driver, self.node)
        cards = cdi.cards_of(await self.api.node_slices(self.node, self.driver))
        await self.ledger.check(allocation)
        made = await made_for(self.mig, allocation, cards)
        minors = await asyncio.to_thread(read_mig_minors, self.mig_minors_file) if made else None
        content = cdi.spec(allocation, cards, self.mps, self.device_dir, made, minors)
        path = await asyncio.to_thread(cdi.write, self.cdi_dir, ref.uid, content)
        names = [d["name"] for d in content["devices"]]
        devices = tuple(
            PreparedDevice(device, (cdi.cdi_id(name),)) for device, name in zip(allocation.devices, names, strict=True)
        )
        log.info("prepared %s: %s in %s", ref.describe(), ", ".join(d.device for d in allocation.devices), path)
        return Outcome(devices)

    async def _unprepare(self, ref: ClaimRef) -> Outcome:
        removed = await asyncio.to_thread(cdi.remove, self.cdi_dir, ref.uid)
        await self.ledger.release(ref.uid)
        log.info("unprepared %s%s", ref.describe(), "" if removed else " (nothing was prepared)")
        return Outcome()


class _Work(Protocol):
    async def __call__(self, ref: ClaimRef) -> Outcome: ...
