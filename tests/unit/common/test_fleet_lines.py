"""Line numbers of fleet errors where the offending key is not the first line of its entry."""

from __future__ import annotations

import pytest

from gpuledger_dev.fleet import FleetError, parse_fleet

TEXT = """\
nodes:
  - profile: rtx3090-1
    name: a
  - profile: rtx3090-1
    name: b
  - profile: tesla-p4-2
    name: a
"""


def test_a_repeated_name_points_at_the_repeated_name() -> None:
    with pytest.raises(FleetError) as caught:
        parse_fleet(TEXT, "fleet.yaml")
    assert str(caught.value) == "fleet.yaml:7: nodes[2].name: node 'a' repeats line 3"


def test_an_entry_that_is_not_a_mapping_points_at_the_entry() -> None:
    with pytest.raises(FleetError) as caught:
        parse_fleet("nodes:\n  - name: a\n    profile: rtx3090-1\n  - just-a-name\n", "fleet.yaml")
    assert str(caught.value) == "fleet.yaml:4: nodes[1]: must be a mapping"
