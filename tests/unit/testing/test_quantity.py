"""The fake API server's quantities: strings as kube-apiserver v1.36.3 reads a pod's resources back.

Every case here was read back from a real API server (the contract test,
tests/e2e/test_fake_contract.py, checks a table of them against it on every e2e run)."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from gpuledger_dev.apiserver_quantity import BAD_SUFFIX, FORMAT_WRONG, Format, canonical, parse, stored

STORED = [
    # DecimalSI: the largest suffix that holds the value with a whole number before it
    ("4000", "4k"), ("4k", "4k"), ("2048", "2048"), ("1000m", "1"), ("0.5", "500m"), (".5", "500m"),
    ("1.5", "1500m"), ("1.5k", "1500"), ("1000M", "1G"), ("1000000k", "1G"), ("4000000", "4M"),
    ("1.00", "1"), ("10.0", "10"), ("1.10", "1100m"), ("1200m", "1200m"), ("1.5E", "1500P"),
    # rounded up to milli units
    ("5n", "1m"), ("1500n", "1m"), ("999n", "1m"), ("1u", "1m"), ("0.5m", "1m"), ("1200u", "2m"),
    ("0.0000000001", "1m"),
    # BinarySI, and DecimalSI for what it cannot hold
    ("1024Mi", "1Gi"), ("4096Mi", "4Gi"), ("2048Ki", "2Mi"), ("1536Ki", "1536Ki"), ("1000Ki", "1000Ki"),
    ("1.5Gi", "1536Mi"), ("1.5Mi", "1536Ki"), ("1.5Ki", "1536"), ("0.5Ki", "512"), ("12.5Mi", "12800Ki"),
    ("1.25Ti", "1280Gi"), ("1.5Ei", "1536Pi"), ("3Ei", "3Ei"), ("1.0001Ki", "1024103m"), ("0.001Ki", "1024m"),
    # DecimalExponent
    ("1e3", "1e3"), ("1e7", "10e6"), ("1e19", "10e18"), ("12e2", "1200"), ("1.5e3", "1500"), ("10e-1", "1"),
    ("1.5e-3", "2e-3"), ("1e-9", "1e-3"), ("1e-10", "1e-3"), ("1.5e-9", "1e-3"), ("1.23456789e3", "1234568e-3"),
    # kept as written where the parser found it canonical-looking
    ("+5", "+5"), ("01", "01"), ("007", "007"), ("1E3", "1E3"), ("1e+3", "1e+3"), ("1.G", "1.G"), ("5.", "5."),
    ("+1Ki", "+1Ki"), ("1Ki", "1Ki"), ("7Ki", "7Ki"), ("8Ki", "8Ki"), ("100e-3", "100e-3"), ("1.500", "1.500"),
    ("1e0", "1e0"), ("1e18", "1e18"), ("1e21", "1e21"), ("123456789012345678", "123456789012345678"),
    ("12345678901Ki", "12345678901Ki"), ("123456789012Ki", "123456789012Ki"),
    # zero, however written
    ("0", "0"), ("-0", "0"), ("000", "0"), ("0Gi", "0"), ("0m", "0"), ("0.0", "0"), ("0e5", "0"), ("e3", "0"),
    ("-", "0"), ("+", "0"), (".", "0"),
    # beyond int64 and the E suffix, as the real implementation has it
    ("1000E", "1"), ("1000P", "1E"), ("100000000000000000000", "100E"), ("1000000000000000000000m", "1E"),
    ("1234567890123456789", "1234567890123456789"), ("9223372036854775808", "9223372036854775808"),
    ("99999999999999999999999999999999999", "99999999999999999999999999999999999"),
    ("9Ei", "9223372036854775807"), ("8Ei", "9223372036854775807"), ("10000000000000000000Ki", "9223372036854775807"),
]  # fmt: skip


@pytest.mark.parametrize(("written", "read"), STORED)
def test_a_quantity_is_stored_as_the_api_server_writes_it(written: str, read: str) -> None:
    assert stored(written) == read


@pytest.mark.parametrize(("written", "error"), [
    ("1x", FORMAT_WRONG), ("1.2.3", FORMAT_WRONG), ("", FORMAT_WRONG),
    ("--1", BAD_SUFFIX), ("1k3", BAD_SUFFIX), ("1e", BAD_SUFFIX), ("1Mi3", BAD_SUFFIX), ("1ee3", BAD_SUFFIX),
])  # fmt: skip
def test_what_is_not_a_quantity_is_refused_in_the_api_servers_words(written: str, error: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(error)}$"):
        parse(written)


def test_the_format_follows_the_suffix() -> None:
    assert parse("4k").format is Format.DECIMAL_SI
    assert parse("4Ki").format is Format.BINARY_SI
    assert parse("4e3").format is Format.DECIMAL_EXPONENT
    assert parse("0.5Ki").format is Format.BINARY_SI and parse("0.001Ki").value == Decimal("1.024")


@pytest.mark.parametrize(("value", "format_", "text"), [
    (Decimal(1023), Format.BINARY_SI, "1023"), (Decimal(1024), Format.BINARY_SI, "1Ki"),
    (Decimal("1536.5"), Format.BINARY_SI, "1536500m"), (Decimal(-2048), Format.BINARY_SI, "-2Ki"),
    (Decimal(1000), Format.DECIMAL_EXPONENT, "1e3"), (Decimal("0.01"), Format.DECIMAL_SI, "10m"),
])  # fmt: skip
def test_canonical_writes_the_largest_exact_suffix(value: Decimal, format_: Format, text: str) -> None:
    assert canonical(value, format_) == text
