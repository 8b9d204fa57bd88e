"""Kubernetes quantities (``500m``, ``16Gi``, ``4k``, ``1e3``) as exact numbers (pure).

The API server stores a quantity in its canonical form (``4000`` comes back as ``4k``), so every
reader of a quantity the API server returned parses every form, never only bare digits.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gpuledger_core.errors import InvalidArgument

MIB = 1 << 20
SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("0.001"), "": Decimal(1), "k": Decimal(10**3),
    "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}  # fmt: skip
BINARY = frozenset(s for s in SUFFIXES if s.endswith("i"))
# A signed decimal number, then a suffix or a decimal exponent (``1e3``).
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")


def parse_quantity(raw: Any, field: str) -> tuple[Decimal, str]:
    """A quantity as a number, and the suffix it was written with (empty for none or for a
    decimal exponent). Negative quantities are refused: no resource here can be negative."""
    text = str(raw).strip()
    found = None if isinstance(raw, bool) else _QUANTITY.fullmatch(text)
    if found is None:
        raise InvalidArgument(field, f"{text!r} is not a Kubernetes quantity")
    number, suffix = found.group(1), found.group(2) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        number, suffix = number + suffix, ""
    try:
        value = Decimal(number) * SUFFIXES[suffix]
    except ArithmeticError:  # an exponent beyond what any resource could mean
        raise InvalidArgument(field, f"{text!r} is out of range") from None
    if value < 0:
        raise InvalidArgument(field, f"{text!r} is negative")
    return value, suffix


def quantity(raw: Any, field: str) -> Decimal:
    """A quantity as a number."""
    return parse_quantity(raw, field)[0]


def whole_up(raw: Any, field: str) -> int:
    """A quantity rounded up to a whole number (bytes, percent)."""
    return int(quantity(raw, field).to_integral_value(rounding=ROUND_CEILING))
