"""The inventory's settings refuse bad values, naming the field."""

from __future__ import annotations

import pytest

from gpuledger_core.errors import InvalidArgument
from gpuledger_inventory.settings import load_settings


@pytest.mark.parametrize(
    ("flags", "field"),
    [(["--log-level", "loud"], "log_level"), (["--log-format", "xml"], "log_format")],
)
def test_bad_logging_settings_are_refused(flags: list[str], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        load_settings(["--node", "n1", *flags], {})
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--mode", "both"], "mode"),
        (["--mode", "dra", "--kube", "off"], "mode"),  # DRA mode publishes to the API server
        (["--mode", "dra", "--kube", "on", "--slots-per-card", "0"], "slots_per_card"),
        (["--mode", "dra", "--kube", "on", "--dra-memory-step-mib", "0"], "dra_memory_step_mib"),
    ],
)
def test_bad_dra_settings_are_refused(flags: list[str], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        load_settings(["--node", "n1", *flags], {})
    assert caught.value.field == field


def test_nodes_are_classic_unless_told_and_dra_reads_from_the_environment() -> None:
    assert load_settings(["--node", "n1"], {}).mode == "classic"
    found = load_settings(["--node", "n1"], {"GPULEDGER_MODE": "dra", "GPULEDGER_KUBE": "on",
                                             "GPULEDGER_DRA_BINDING_CONDITIONS": "false"})
    assert (found.mode, found.dra_binding_conditions, found.slots_per_card) == ("dra", False, 8)
    assert load_settings(["--node", "n1", "--mode", "dra", "--kube", "on"], {}).dra_binding_conditions
