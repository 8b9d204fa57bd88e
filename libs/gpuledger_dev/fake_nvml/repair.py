"""The fake NVML's calls for a card's repair: the handle by UUID, ECC counts, pending page
retirement and row remapping (in pynvml's shapes); and ``gpu_reset``, which stands in for
``nvidia-smi --gpu-reset`` (NVML offers no reset call).

A reset is scripted per card in the fleet file (``resets``: ok, fail, hang, unsupported, how long,
whether a lost card comes back); a card without a script resets fine in half a second. It is
refused while the card has processes. One that succeeds clears the volatile ECC counts, applies a
pending row remap or page retirement (a failed remap stays), applies a pending MIG mode (no MIG
instance survives it) and brings a lost card back. ``nvmlDeviceGetHandleByUUID`` takes a MIG
device's UUID too, and answers with the MIG device's handle.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as _nvml

from gpuledger_dev.fake_nvml.model import FakeCard, FakeReset
from gpuledger_dev.fake_nvml.state import NvmlState
from gpuledger_dev.fleet_script import ResetResult, ResetSpec

_ENABLED, _DISABLED = int(_nvml.NVML_FEATURE_ENABLED), int(_nvml.NVML_FEATURE_DISABLED)


class RepairCalls(NvmlState):
    """The pynvml calls a card's check makes, and the reset that pynvml does not have."""

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        with self._cond:
            self._enter("nvmlDeviceGetHandleByUUID")
            for card in self._cards:
                migs = card.mig.devices() if card.mig else []
                found = (
                    card if card.uuid == text else next((m for m in migs if m.uuid == text), None)
                )
                if found is None:
                    continue
                if card.lost:
                    raise _nvml.NVMLError_GpuIsLost()
                return ctypes.pointer(found.handle)
            raise _nvml.NVMLError_NotFound()

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        card = self._card("nvmlDeviceGetTotalEccErrors", handle)
        if not card.arch.ecc:
            raise _nvml.NVMLError_NotSupported()
        if errorType not in (0, 1) or counterType not in (0, 1):
            raise _nvml.NVMLError_InvalidArgument()
        counts = card.ecc.volatile if counterType == _nvml.NVML_VOLATILE_ECC else card.ecc.aggregate
        return counts[errorType]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        card = self._card("nvmlDeviceGetRetiredPagesPendingStatus", device)
        if not card.arch.ecc or card.remaps_rows:
            raise _nvml.NVMLError_NotSupported()
        return _ENABLED if card.ecc.pages_pending else _DISABLED

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        card = self._card("nvmlDeviceGetRemappedRows", device)
        if not card.remaps_rows:
            raise _nvml.NVMLError_NotSupported()
        ecc = card.ecc
        return (ecc.rows[0], ecc.rows[1], int(ecc.remap_pending), int(ecc.remap_failure))

    # --- not pynvml: the reset command -----------------------------------------------------------

    def gpu_reset(self, uuid: str) -> FakeReset:
        """``nvidia-smi --gpu-reset -i <uuid>`` on this node: how long it takes and how it exits."""
        with self._cond:
            self.calls["gpu_reset"] = self.calls.get("gpu_reset", 0) + 1
            self._fire_due()
            card = next((c for c in self._cards if c.uuid == uuid), None)
            if card is None:
                return FakeReset(0.0, 6, f"No devices were found matching {uuid}")
            return self._reset(card)

    def _reset(self, card: FakeCard) -> FakeReset:
        spec = self._next_reset(card)
        where = f"GPU {card.bus_id}"
        if spec.result is ResetResult.UNSUPPORTED:
            return FakeReset(0.1, 3, f"Resetting {where} is not supported.")
        if card.processes:
            return FakeReset(0.1, 255, f"{where}: In use by another client")
        if spec.result is ResetResult.HANG:
            return FakeReset(None, 0, "")
        if spec.result is ResetResult.FAIL or (card.lost and not spec.returns):
            return FakeReset(spec.seconds, 255, f"Unable to reset {where}: Unknown Error")
        card.ecc.reset()
        if card.mig is not None:
            card.mig.reset()
        card.lost = False
        return FakeReset(spec.seconds, 0, f"{where} was successfully reset.")

    def _next_reset(self, card: FakeCard) -> ResetSpec:
        scripted = [r for r in self._sim.resets if r.card == card.index]
        card.resets += 1
        return scripted[card.resets - 1] if card.resets <= len(scripted) else ResetSpec(card.index)
