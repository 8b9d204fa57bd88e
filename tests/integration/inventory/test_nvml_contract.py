"""The inventory's NVML adapter against the fake NVML and, where a GPU is present, the real one:
the same assertions on both, so the fake is held to the driver.

The real side is marked ``gpu`` and deselected by the default run (tox's ``tests`` passes
``-m "not gpu"``); on a machine with a GPU, ``tox -e gpu`` runs it (and ``python -m
benchmarks.nvml_probe`` prints what the driver answered)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuledger_core.model import PcieLevel
from gpuledger_dev.fake_nvml import FakeNvml
from gpuledger_dev.fleet import load_fleet
from gpuledger_dev.fleet_script import node_script
from gpuledger_inventory.inventory import MigMode, Scan
from gpuledger_inventory.nvml import NvmlGpus, load_pynvml

FLEET = Path(__file__).resolve().parents[2] / "e2e" / "fleet.yaml"
BUS_ID = re.compile(r"^[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.gpu)])
def gpus(request: pytest.FixtureRequest) -> Iterator[NvmlGpus]:
    if request.param == "fake":
        fake = FakeNvml(node_script(load_fleet(FLEET), "h100-0"))
        found = NvmlGpus(fake, fake.numa_node, "fake")
    else:
        found = NvmlGpus(load_pynvml())  # fails loudly where the driver cannot be loaded
    found.open()
    try:
        yield found
    finally:
        found.close()


def test_every_card_is_described_as_the_driver_describes_it(gpus: NvmlGpus) -> None:
    scan = gpus.scan()
    assert scan.cards, "no card found"
    assert [c.card.index for c in scan.cards] == list(range(len(scan.cards)))
    assert len({c.uuid for c in scan.cards}) == len(scan.cards)
    for info in scan.cards:
        card = info.card
        assert UUID.match(card.uuid), card.uuid
        assert card.model and card.memory_mib > 0
        assert card.minor is not None and card.minor >= 0
        assert card.pci_bus_id is not None and BUS_ID.match(card.pci_bus_id), card.pci_bus_id
        assert card.numa is None or card.numa >= 0
        major, minor = info.compute_capability or (0, 0)
        assert major >= 3 and minor >= 0
        assert isinstance(info.mig_mode, MigMode) and isinstance(info.mig_pending, MigMode)
    assert scan.driver_version and re.match(r"^\d+\.\d+", scan.driver_version)
    assert scan.cuda_version and re.match(r"^\d+\.\d+$", scan.cuda_version)


def test_the_topology_names_every_pair_once_with_a_known_level(gpus: NvmlGpus) -> None:
    scan = gpus.scan()
    indexes = [c.card.index for c in scan.cards]
    pairs = [(link.a, link.b) for link in scan.links]
    assert len(pairs) == len(set(pairs))
    assert all(a < b and a in indexes and b in indexes for a, b in pairs)
    if len(indexes) > 1:
        assert len(pairs) == len(indexes) * (len(indexes) - 1) // 2  # every pair, as nvidia-smi topo -m
    assert all(isinstance(link.pcie, PcieLevel) and link.nvlinks >= 0 for link in scan.links)


def test_usage_and_health_events_answer_for_every_card(gpus: NvmlGpus) -> None:
    scan: Scan = gpus.scan()
    usage = gpus.usage(scan)
    for info in scan.cards:
        used = usage.of(info.uuid)
        assert used is not None and used.memory_used_mib is not None
        assert 0 <= used.memory_used_mib <= info.card.memory_mib
    refused = gpus.watch(scan)  # uuid -> why its registration failed; the others are watched
    assert set(refused) <= {c.uuid for c in scan.cards}
    event = gpus.wait(50)  # an event within the time, or none
    assert event is None or event.uuid is None or event.uuid in {c.uuid for c in scan.cards}
