"""Kubernetes quantities, and GPU memory amounts in whole MiB.

Why our own parser: the node agent must never crash on a malformed annotation, must round the
way the real agent does (up, to whole MiB), and must reject exactly what the real consumer
rejects. Binding to a client library's quantity helper would make those three properties
depend on another project's edge cases (float rounding, silently trimmed whitespace), so the
grammar is written out here and tested value by value.

Grammar (the Kubernetes one)::

    quantity := [sign] number [suffix]
    number   := digits | digits "." [digits] | "." digits
    suffix   := Ki | Mi | Gi | Ti | Pi | Ei          (binary, powers of 1024)
              | k | M | G | T | P | E | m          (decimal SI; m = milli)
              | (e | E) [sign] digits              (decimal exponent)

Values are kept exact (``fractions.Fraction``), so ``1000M`` is exactly 10^9 bytes and rounds
up to 954 MiB, never to 953 through a float error.

Decisions, all deliberate:

- **Surrounding whitespace is malformed** (docs/contract.md §2), not trimmed.
- **Milli (``m``) is rejected for memory.** ``512m`` is 0.512 *bytes*: sub-byte granularity is
  meaningless for memory, and in practice ``m`` is a typo for ``M`` or ``Mi``. Every milli value
  an author could mean is also below 1 MiB unless it has ten digits or more, so rejecting it
  changes the *message* (``memory-quantity`` with a hint) rather than the verdict.
- **Magnitude is bounded.** Inputs longer than 64 characters and amounts of 2^63 bytes or more are
  malformed (the Kubernetes value is an int64 of bytes); this also keeps hostile inputs like
  ``1e999999999`` from costing time.
- Amounts below 1 MiB (zero, negatives, ``4096``) parse as quantities but break
  ``memory-minimum``.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Final

from enforcement.rules import ContractError
from workloads.plan import MiB as MIB

MAX_BYTES: Final[int] = 2**63 - 1
MAX_LENGTH: Final[int] = 64

_BINARY: Final[dict[str, int]] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final[dict[str, int]] = {"m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}

# Exponent alternatives come first so "1E3" is an exponent, while a lone "E" is exa.
_QUANTITY: Final[re.Pattern[str]] = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[kMGTPEm])?"
)


def parse_quantity(value: str) -> Fraction:
    """The exact value of a Kubernetes quantity (bytes, for memory); may be zero or negative.

    Raises ``ContractError(rule="memory-quantity")`` for anything that is not a quantity.
    """
    if not isinstance(value, str):
        raise ContractError("memory-quantity", f"{value!r} is not a string")
    if value == "":
        raise ContractError("memory-quantity", "the value is empty")
    if value != value.strip():
        raise ContractError("memory-quantity", f"{value!r} has surrounding whitespace")
    if len(value) > MAX_LENGTH:
        raise ContractError("memory-quantity", f"the value is longer than {MAX_LENGTH} characters")
    match = _QUANTITY.fullmatch(value)
    whole = match.group("int") if match else ""
    frac = (match.group("frac") or "") if match else ""
    if match is None or (whole == "" and frac == ""):
        raise ContractError("memory-quantity", f"{value!r} is not a Kubernetes quantity")
    suffix = match.group("suffix") or ""
    digits = int(whole + frac or "0")
    if match.group("sign") == "-":
        digits = -digits
    exp10 = -len(frac)
    exp2 = 0
    if suffix in _BINARY:
        exp2 = _BINARY[suffix]
    elif suffix in _DECIMAL:
        exp10 += _DECIMAL[suffix]
    else:
        exp10 += int(suffix[1:])
    if digits == 0:
        return Fraction(0)
    # |digits| < 10**64, so beyond these exponents the verdict is known without building the
    # number: too large for int64 bytes, or far below one byte (clamped, still below 1 MiB).
    if exp10 + len(str(abs(digits))) > 40:
        raise ContractError("memory-quantity", f"{value!r} is out of range")
    exp10 = max(exp10, -200)
    scaled = Fraction(digits) * Fraction(10) ** exp10 * 2**exp2
    if abs(scaled) > MAX_BYTES:
        raise ContractError("memory-quantity", f"{value!r} is out of range")
    return scaled


_BINARY_BY_POWER: Final = {v // 10: k for k, v in _BINARY.items()}
_DECIMAL_BY_POWER: Final = {v // 3: k for k, v in _DECIMAL.items()}


def canonical_quantity(value: str) -> str:
    """``value`` as Kubernetes writes the quantity back (``resource.Quantity``'s ``String()``), the form
    a component that canonicalises compares as a string: ``4096Mi`` -> ``4Gi``, ``1.5Gi`` -> ``1536Mi``,
    ``4000M`` -> ``4G``, ``512Ki`` -> ``512Ki``, ``1000e0`` -> ``1e3``. A binary suffix keeps the binary
    form while the amount is a whole number of bytes; an exponent keeps the exponent form; every other
    quantity takes the decimal form (the largest suffix of ``m k M G T P E`` that leaves a whole
    number). Raises ``ContractError`` when it is no quantity.
    """
    amount = parse_quantity(value)
    match = _QUANTITY.fullmatch(value)
    suffix = (match.group("suffix") if match else "") or ""
    sign = "-" if amount < 0 else ""
    amount = abs(amount)
    if amount == 0:
        return "0"
    if suffix in _BINARY and amount.denominator == 1:
        whole, power = int(amount), 0
        while power < max(_BINARY_BY_POWER) and whole % 1024 == 0:
            whole, power = whole // 1024, power + 1
        return f"{sign}{whole}{_BINARY_BY_POWER.get(power, '')}"
    power = min(_DECIMAL_BY_POWER)
    scaled = amount / Fraction(10) ** (3 * power)
    if scaled.denominator != 1:
        scaled = Fraction(math.ceil(scaled))  # below a thousandth: Kubernetes rounds up
    whole = int(scaled)
    while power < max(_DECIMAL_BY_POWER) and whole % 1000 == 0:
        whole, power = whole // 1000, power + 1
    if suffix[:1] in ("e", "E"):  # the exponent form stays one (1000 written 1e3 is 1e3)
        return f"{sign}{whole}e{3 * power}" if power else f"{sign}{whole}"
    return f"{sign}{whole}{_DECIMAL_BY_POWER[power]}"


def parse_memory_mib(value: str) -> int:
    """A GPU memory amount in whole MiB, rounded **up**, as the real node agent reads it.

    ``"1000M"`` -> 954, ``"1G"`` -> 954, ``"100M"`` -> 96, ``"4294967296"`` -> 4096, ``"1.5Gi"`` -> 1536.
    Raises ``ContractError`` with rule ``memory-quantity`` (not a quantity, whitespace, milli,
    out of range) or ``memory-minimum`` (parses, but below 1 MiB).
    """
    amount = parse_quantity(value)
    if isinstance(value, str) and value.endswith("m"):
        raise ContractError(
            "memory-quantity",
            f"{value!r} uses the milli suffix m (thousandths of a byte); did you mean M or Mi?",
        )
    if amount < MIB:
        raise ContractError(
            "memory-minimum", f"{value!r} is {_describe_bytes(amount)}, below the 1 MiB minimum"
        )
    return math.ceil(amount / MIB)


def format_mib(mib: int) -> str:
    """The canonical written form of a whole-MiB amount, as a scheduler writes it: ``<N>Mi``."""
    return f"{mib}Mi"


def _describe_bytes(amount: Fraction) -> str:
    if amount.denominator == 1:
        return f"{amount.numerator} bytes"
    return f"{float(amount):.6g} bytes"
