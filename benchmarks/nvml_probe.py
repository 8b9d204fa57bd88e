"""Run the inventory's NVML adapter against the real NVML and print what it finds, as JSON.

    python -m benchmarks.nvml_probe [--events-ms 2000] [--repeat 5]

    python -m benchmarks.nvml_probe --fake-fleet FILE --node NAME   # the same, on the fake NVML

Prints the cards, the topology matrix (NV# / PIX / PXB / PHB / NODE / SYS, as nvidia-smi topo -m),
MIG instances, compute processes, which cards accepted health-event registration, and how long a
full scan and a usage poll took. Anything NVML does not support shows as null; a failure to even
initialise NVML is reported as {"ok": false, "error": ...} with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from gpuledger_core.model import PcieLevel
from gpuledger_inventory.inventory import Scan
from gpuledger_inventory.nvml import NvmlGpus, load_pynvml

_PCIE = {
    PcieLevel.SAME_BOARD: "BOARD",
    PcieLevel.SINGLE_SWITCH: "PIX",
    PcieLevel.MULTI_SWITCH: "PXB",
    PcieLevel.HOST_BRIDGE: "PHB",
    PcieLevel.NUMA_NODE: "NODE",
    PcieLevel.SYSTEM: "SYS",
}


def matrix(scan: Scan) -> list[list[str]]:
    indexes = [c.card.index for c in scan.cards]
    cells = {(ln.a, ln.b): f"NV{ln.nvlinks}" if ln.nvlinks else _PCIE[ln.pcie] for ln in scan.links}
    return [
        [("X" if a == b else cells.get((min(a, b), max(a, b)), "?")) for b in indexes]
        for a in indexes
    ]


def card_json(scan: Scan, gpus: NvmlGpus) -> list[dict[str, Any]]:
    usage = gpus.usage(scan)
    out = []
    for info in scan.cards:
        used = usage.of(info.uuid)
        c = info.card
        out.append(
            {
                "index": c.index,
                "uuid": c.uuid,
                "model": c.model,
                "memory_mib": c.memory_mib,
                "minor": c.minor,
                "pci_bus_id": c.pci_bus_id,
                "numa": c.numa,
                "compute_capability": info.compute_capability,
                "nvswitch_links": info.nvswitch_links,
                "mig": {
                    "mode": info.mig_mode.value,
                    "pending": info.mig_pending.value,
                    "instances": [_slots(m) for m in info.mig],
                },
                "memory_used_mib": used.memory_used_mib if used else None,
                "processes": [_slots(p) for p in used.processes] if used else [],
            }
        )
    return out


def _slots(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__slots__}


def _fake(path: str, node: str) -> NvmlGpus:
    """The same adapter on the fake NVML: to check this script without a GPU."""
    from gpuledger_dev.fake_nvml import FakeNvml
    from gpuledger_dev.fleet import load_fleet
    from gpuledger_dev.fleet_script import node_script

    fake = FakeNvml(node_script(load_fleet(path), node))
    return NvmlGpus(fake, fake.numa_node, "fake")


def timed(fn: Any, repeat: int) -> tuple[Any, dict[str, float]]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, {"first_s": times[0], "median_s": statistics.median(times), "max_s": max(times)}


def probe(args: argparse.Namespace) -> dict[str, Any]:
    gpus = NvmlGpus(load_pynvml()) if not args.fake_fleet else _fake(args.fake_fleet, args.node)
    start = time.perf_counter()
    try:
        gpus.open()
    except Exception as err:
        return {"ok": False, "error": str(err)}
    init_s = time.perf_counter() - start
    try:
        scan, scan_t = timed(gpus.scan, args.repeat)
        _, usage_t = timed(lambda: gpus.usage(scan), args.repeat)
        failed = gpus.watch(scan)
        events = []
        deadline = time.monotonic() + args.events_ms / 1000
        while time.monotonic() < deadline:
            event = gpus.wait(max(1, int((deadline - time.monotonic()) * 1000)))
            if event is not None:
                events.append(_slots(event))
        return {
            "ok": True,
            "driver_version": scan.driver_version,
            "cuda_driver_version": scan.cuda_version,
            "nvml_init_s": init_s,
            "scan": scan_t,
            "usage_poll": usage_t,
            "cards": card_json(scan, gpus),
            "lost": list(scan.lost),
            "problems": list(scan.problems),
            "topology": {"cards": [c.card.index for c in scan.cards], "matrix": matrix(scan)},
            "health_events": {
                "registration_failed": failed,
                "registered": [c.uuid for c in scan.cards if c.uuid not in failed],
                "seen_in_window": events,
            },
        }
    finally:
        gpus.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--events-ms", type=int, default=2000, help="how long to listen for health events"
    )
    parser.add_argument("--repeat", type=int, default=5, help="scans and polls to time")
    parser.add_argument(
        "--fake-fleet", default="", help="run on the fake NVML (a fleet file) instead"
    )
    parser.add_argument("--node", default="", help="the fleet node, with --fake-fleet")
    result = probe(parser.parse_args())
    json.dump(result, sys.stdout, indent=2, default=str)
    print()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
