"""GPU that a node's CPU and memory can no longer serve, against the workload's own proportions.

The typical GPU pods of a workload ask, on average (popularity-weighted), ``cpu_per_gpu``
millicores and ``mem_per_gpu`` MiB for each milli of GPU. A node whose free CPU (or memory) covers
less than that for its free GPU strands the difference: ``stranded = max(0, gpu_room -
cpu_free / cpu_per_gpu, gpu_room - mem_free / mem_per_gpu)`` milli of GPU. ``default`` adds the
growth of this to the growth of fragmentation, so a pod heavy in CPU goes where CPU is plentiful
and leaves CPU-poor nodes to pods light in it. See docs/placement.md for the measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger_core.packing.frag import Workload
from gpuledger_core.packing.state import UNTRACKED


@dataclass(frozen=True, slots=True)
class Balance:
    cpu_per_gpu: float  # millicores per milli of GPU; 0: not counted
    mem_per_gpu: float  # MiB per milli of GPU; 0: not counted

    @staticmethod
    def of(workload: Workload) -> Balance:
        """The workload's proportions over its typical pods that want cards."""
        gpu = sum(w * pod.count * pod.milli for pod, w in workload.pods if pod.count)
        if gpu <= 0:
            return Balance(0.0, 0.0)
        cpu = sum(w * pod.cpu_milli for pod, w in workload.pods if pod.count)
        mem = sum(w * pod.memory_mib for pod, w in workload.pods if pod.count)
        return Balance(cpu / gpu, mem / gpu)

    def stranded(self, gpu_room: int, cpu_free: int, mem_free: int) -> float:
        """Milli of free GPU beyond what the free CPU and memory serve in these proportions."""
        worst = 0.0
        for free, per in ((cpu_free, self.cpu_per_gpu), (mem_free, self.mem_per_gpu)):
            if per > 0 and free != UNTRACKED:
                worst = max(worst, gpu_room - max(free, 0) / per)
        return worst

    def growth(self, gpu_room: int, cpu_free: int, mem_free: int, gpu: int, cpu: int, mem: int) -> float:
        """How much ``stranded`` grows when a pod takes ``gpu``, ``cpu`` and ``mem``."""
        after = self.stranded(
            gpu_room - gpu,
            cpu_free if cpu_free == UNTRACKED else cpu_free - cpu,
            mem_free if mem_free == UNTRACKED else mem_free - mem,
        )
        return after - self.stranded(gpu_room, cpu_free, mem_free)
