"""Resource quantities as the Kubernetes API server stores them (apimachinery's ``resource.Quantity``).

A quantity keeps the format of its suffix: DecimalSI (``k``, ``M``, ``m``, none), BinarySI (``Ki``,
``Mi``, ...) or DecimalExponent (``e3``). Its canonical string writes the value in the largest
suffix of that format that holds it exactly, with a whole number before it: ``4000`` is ``4k``,
``1024Mi`` is ``1Gi``, ``1.5k`` is ``1500``, ``1e7`` is ``10e6``. A binary value under 1024, or one
that is not whole, is written in DecimalSI. Values are rounded up (away from zero) to nano units
when parsed, and to milli units when a pod's resources are defaulted (``stored``).

The API server writes a quantity back exactly as it was written when that string already was in a
canonical-looking form (the parser keeps it: ``+5``, ``007``, ``1E3``, ``1.G`` come back as sent);
``stored`` keeps those too. Two quirks of the real implementation are kept on purpose: a DecimalSI
value beyond the ``E`` suffix loses its suffix (``1000E`` reads back as ``1``), and a BinarySI
value is capped at 2^63-1. contract tests compare a table of cases against the real server.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_UP, Context, Decimal
from enum import StrEnum

FORMAT_WRONG = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
BAD_SUFFIX = "unable to parse quantity's suffix"
MAX_INT64 = Decimal(2**63 - 1)
NANO, MILLI = -9, -3
_EXACT = Context(prec=200)  # far beyond any quantity's digits: arithmetic here is exact
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX = {exponent: suffix for suffix, exponent in _DECIMAL.items()}
_BINARY_SUFFIX = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_SUFFIX_LETTERS = frozenset("eEinumkKMGTP")


class Format(StrEnum):
    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


@dataclass(frozen=True, slots=True)
class Quantity:
    value: Decimal
    format: Format
    kept: str = ""  # the string as written, where the API server keeps it
    scale: int | None = None  # the power of ten of a value parsed exactly (None: rounded to nano)

    def __str__(self) -> str:
        return self.kept or canonical(self.value, self.format)


def stored(text: str) -> str:
    """``text`` as a pod's resources hold it once created (parsed, then rounded up to milli units)."""
    return str(round_up(parse(text), MILLI))


def parse(text: str) -> Quantity:
    """A quantity as ``resource.ParseQuantity`` reads it; ``ValueError`` with the API server's message."""
    if not text:
        raise ValueError(FORMAT_WRONG)
    if text == "0":
        return Quantity(Decimal(0), Format.DECIMAL_SI, "0", 0)
    sign, num, denom, suffix = _scan(text)
    base, exponent, format_ = _interpret(suffix)
    exact = _exactly(text, sign, num, denom, base, exponent, format_)
    if exact is not None:
        return exact
    amount = _EXACT.multiply(Decimal(f"{sign}{num}.{denom or '0'}"), _EXACT.power(base, exponent))
    if amount:
        amount = amount.quantize(Decimal(1).scaleb(NANO), rounding=ROUND_UP, context=_EXACT)
    if format_ is Format.BINARY_SI and abs(amount) > MAX_INT64:
        amount = MAX_INT64.copy_sign(amount)
    if format_ is Format.BINARY_SI and 0 < abs(amount) < 1:
        format_ = Format.DECIMAL_SI
    return Quantity(amount, format_)


def round_up(quantity: Quantity, scale: int) -> Quantity:
    """``Quantity.RoundUp``: to ``scale`` (a power of ten) away from zero; the kept string goes
    unless the value was parsed exactly with at least that scale."""
    if quantity.scale is not None and quantity.scale >= scale:
        return quantity
    value = quantity.value.quantize(Decimal(1).scaleb(scale), rounding=ROUND_UP, context=_EXACT)
    return Quantity(value, quantity.format)


def canonical(value: Decimal, format_: Format) -> str:
    """The API server's string for ``value`` in ``format_`` (``CanonicalizeBytes``)."""
    if not value:
        return "0"
    if format_ is Format.BINARY_SI and (-1024 < value < 1024 or value != value.to_integral_value()):
        format_ = Format.DECIMAL_SI
    if format_ is Format.BINARY_SI:
        number, power = int(value), 0
        while number % 1024 == 0:
            number, power = number // 1024, power + 1
        return f"{number}{_BINARY_SUFFIX[power]}"
    number, exponent = _decimal_parts(value)
    if format_ is Format.DECIMAL_EXPONENT:
        return f"{number}e{exponent}" if exponent else str(number)
    return f"{number}{_DECIMAL_SUFFIX.get(exponent, '')}"  # beyond E the real server drops the suffix


def _decimal_parts(value: Decimal) -> tuple[int, int]:
    """``value`` as a whole number times ten to a multiple of three, the whole number smallest."""
    sign, digits, exponent = value.normalize(_EXACT).as_tuple()
    assert isinstance(exponent, int)
    number = int("".join(map(str, digits)))
    while exponent % 3:
        number, exponent = number * 10, exponent - 1
    return (-number if sign else number), exponent


def _scan(text: str) -> tuple[str, str, str, str]:
    """Sign, whole digits (leading zeros gone, ``0`` for none), fraction digits and suffix."""
    at, end = 0, len(text)
    sign = "-" if text[0] == "-" else ""
    if text[0] in "+-":
        at += 1
    while at < end and text[at] == "0":
        at += 1
    if at == end:
        return sign, "0", "", ""
    start = at
    while at < end and text[at].isdigit():
        at += 1
    num, denom = text[start:at] or "0", ""
    if at < end and text[at] == ".":
        start = at = at + 1
        while at < end and text[at].isdigit():
            at += 1
        denom = text[start:at]
    suffix_at = at
    while at < end and text[at] in _SUFFIX_LETTERS:
        at += 1
    if at < end and text[at] in "+-":
        at += 1
    while at < end and text[at].isdigit():
        at += 1
    if at < end:
        raise ValueError(FORMAT_WRONG)
    return sign, num, denom, text[suffix_at:]


def _interpret(suffix: str) -> tuple[int, int, Format]:
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix], Format.DECIMAL_SI
    if suffix in _BINARY:
        return 2, _BINARY[suffix], Format.BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        try:
            return 10, int(suffix[1:]), Format.DECIMAL_EXPONENT
        except ValueError:
            pass
    raise ValueError(BAD_SUFFIX)


def _exactly(
    text: str, sign: str, num: str, denom: str, base: int, exponent: int, format_: Format
) -> Quantity | None:
    """The parser's fast path (the value fits an int64 at a scale of nano or more), which keeps the
    string as written when it looks canonical; None where the real parser takes the slow path."""
    digits = int(num + denom)
    if format_ is Format.BINARY_SI:
        if exponent < 0 or denom or 15 - len(num) - int(exponent * 3 / 10) - 1 < 0:
            return None
        whole = digits << exponent
        if whole > 2**63 - 1:
            return None
        kept = text if digits & 0x07 else ""
        return Quantity(Decimal(-whole if sign else whole), format_, kept, 0)
    scale = exponent - len(denom)
    if 18 - len(num) - len(denom) < 0 or scale < NANO:
        return None
    shifted = num + denom
    looks_canonical = scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
    value = Decimal(-digits if sign else digits).scaleb(scale, _EXACT)
    return Quantity(value, format_, text if looks_canonical else "", scale)
