"""CPU seconds that each program on this machine spent between two moments, read from /proc.

Benchmarks of the whole stack on one machine (the control plane, nats-server, every gpuledger
service) are bounded by who uses the cores while a burst runs; this says who did. Programs are
grouped by name: a Python program by the module it runs (``python -m gpuledger_placement``) or its
script, anything else by its executable's name, and the kernel's own threads (block I/O, memory
reclaim: no command line) together as ``[kernel]``. Linux only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
KERNEL = "[kernel]"


def program(argv: list[str]) -> str:
    if not argv:
        return "?"
    name = os.path.basename(argv[0])
    if not name.startswith("python"):
        return name
    for i, arg in enumerate(argv[1:], 1):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1]
        if arg == "-c":
            return f"{name} -c"
        if not arg.startswith("-"):
            return os.path.basename(arg)
    return name


@dataclass(frozen=True)
class Snapshot:
    by_pid: dict[int, tuple[str, float]]  # pid: (program, CPU seconds so far)
    busy_s: float  # the whole machine's CPU seconds not idle, every core
    cores: int


def snapshot() -> Snapshot:
    by_pid: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
        utime, stime = int(fields[11]), int(fields[12])
        by_pid[int(entry)] = (program(argv) if argv else KERNEL, (utime + stime) * TICK_S)
    with open("/proc/stat") as f:
        cpu = [int(v) for v in f.readline().split()[1:]]
    idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)
    return Snapshot(by_pid, (sum(cpu[:8]) - idle) * TICK_S, os.cpu_count() or 1)


def spent(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per program between the two snapshots (processes alive at both, or started
    between them), most first."""
    out: dict[str, float] = {}
    for pid, (name, now) in after.by_pid.items():
        earlier = before.by_pid.get(pid)
        used = now - earlier[1] if earlier is not None and earlier[0] == name else now
        if used > 0:
            out[name] = out.get(name, 0.0) + used
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
