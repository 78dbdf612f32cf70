"""Kubernetes resource quantities (``10Gi``, ``250m``, ``1e3``) as exact numbers.

Only what GPU asks and node capacities need: parse a quantity string to a ``Fraction`` (exact, so
``0.5Gi`` and ``512Mi`` compare equal) and to integer bytes or counts, with errors a person can read.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity, or one of the wrong kind (say, fractional)."""


def parse_quantity(value: object) -> Fraction:
    """Parse a quantity as the API server would accept it; ints (from YAML) are accepted too."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    return _parse_text(value)


@functools.lru_cache(maxsize=1024)
def _parse_text(value: str) -> Fraction:
    """A quantity string's value; kept, since a cluster spells its requests with a few strings ("100m",
    "1", "8Gi") and the extender reads every pod's on each of its requests and watch events."""
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise QuantityError(f"{value!r} is not a quantity (expected e.g. 1, 250m, 10Gi)")
    number = Fraction(m["num"])
    if m["bin"]:
        number *= _BINARY[m["bin"]]
    elif m["exp"]:
        number *= Fraction(10) ** int(m["exp"][1:])
    else:
        number *= _DECIMAL[m["dec"] or ""]
    return -number if m["sign"] == "-" else number


def parse_count(value: object) -> int:
    """A whole, non-negative count, as Kubernetes requires for extended resources."""
    q = parse_quantity(value)
    if q.denominator != 1:
        raise QuantityError(f"{value!r} is not a whole number (extended resources must be integers)")
    if q < 0:
        raise QuantityError(f"{value!r} is negative")
    return int(q)


def parse_bytes(value: object) -> int:
    """A byte amount such as ``10Gi``; fractions of a byte round up (as the API server does)."""
    q = parse_quantity(value)
    if q < 0:
        raise QuantityError(f"{value!r} is negative")
    return -(-q.numerator // q.denominator)


def format_bytes(n: int) -> str:
    """The shortest exact binary form: ``10737418240`` -> ``10Gi``; otherwise plain bytes."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


MIB = 2**20
GIB = 2**30
