"""tests.requires: a missing dependency fails the test in CI and skips it elsewhere."""

from __future__ import annotations

import pytest

from tests.requires import importable, in_ci, unavailable


@pytest.mark.parametrize("value", ["true", "1", "yes", "True"])
def test_in_ci_a_missing_dependency_fails_naming_it(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci()
    with pytest.raises(pytest.fail.Exception, match=r"^highspy is not available: install the 'bound' extra \(CI"):
        unavailable("highspy", "install the 'bound' extra")


@pytest.mark.parametrize("value", [None, "", "0", "false"])
def test_elsewhere_a_missing_dependency_skips(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match=r"^highspy is not available: install the 'bound' extra$"):
        unavailable("highspy", "install the 'bound' extra")


def test_importable_tells_a_module_that_imports_from_one_that_does_not() -> None:
    assert importable("json")
    assert not importable("gpuledger_no_such_module")
