"""Full collections freeze their survivors; the thorough collection still finds cycles among them."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from gpuledger_common import gcpause


@pytest.fixture
def installed() -> Iterator[None]:
    gcpause.install()
    try:
        yield
    finally:
        gcpause.uninstall()
        gc.unfreeze()


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_full_collection_freezes_what_survived_it(installed: None) -> None:
    gc.unfreeze()
    kept = [Cycle() for _ in range(100)]
    gc.collect()  # a full collection: its survivors leave the collector's reach
    assert gc.get_freeze_count() >= len(kept)
    gc.collect(0)  # a young collection freezes nothing more
    frozen = gc.get_freeze_count()
    gc.collect(1)
    assert gc.get_freeze_count() == frozen


def test_the_thorough_collection_finds_cycles_among_frozen_objects(installed: None) -> None:
    gc.unfreeze()
    dropped = [Cycle() for _ in range(50)]
    watched = [weakref.ref(c) for c in dropped]
    gc.collect()
    assert gc.get_freeze_count() > 0
    del dropped  # unreachable now, but frozen: only the thorough collection reaches them
    gc.collect()
    assert all(w() is not None for w in watched)
    gcpause.thorough()
    assert all(w() is None for w in watched)
