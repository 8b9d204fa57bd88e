"""What a test does when something it needs is not there.

In CI (``CI`` set and not ``0``/``false``) it fails, naming what is missing and how the project
provides it: CI installs everything the tests need, so a missing piece is a fault to see, never a
skip to overlook. On a developer's machine the same words skip it.
"""

from __future__ import annotations

import importlib
import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def importable(module: str) -> bool:
    """Whether ``module`` imports (a missing or broken install does not)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def unavailable(what: str, remedy: str) -> NoReturn:
    """Fail (in CI) or skip (elsewhere) the test or module asking for ``what``."""
    message = f"{what} is not available: {remedy}"
    if in_ci():
        pytest.fail(f"{message} (CI runs every test: nothing is skipped for a missing dependency)", pytrace=False)
    pytest.skip(message, allow_module_level=True)
