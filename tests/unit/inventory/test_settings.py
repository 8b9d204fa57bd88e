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
