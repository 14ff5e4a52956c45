"""Kubernetes quantities and GPU memory in whole MiB, value by value (docs/contract.md §2)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from enforcement.quantity import format_mib, parse_memory_mib, parse_quantity
from enforcement.rules import ContractError

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        # the contract's own examples: rounded UP to whole MiB
        ("1000M", 954),
        ("1G", 954),
        ("100M", 96),
        ("4294967296", 4096),
        # binary suffixes are exact
        ("1Mi", 1),
        ("4096Mi", 4096),
        ("40Gi", 40960),
        ("1.5Gi", 1536),
        ("1Ti", 1024 * 1024),
        ("1024Ki", 1),
        ("1025Ki", 2),
        # decimal SI and exponents
        ("1e9", 954),
        ("1E9", 954),
        ("1e+9", 954),
        ("1049k", 2),
        ("0.5Gi", 512),
        (".5Gi", 512),
        ("1.Gi", 1024),
        ("+2Gi", 2048),
        ("1048576", 1),
        ("1048577", 2),
        ("1P", 953674317),
        ("7680Mi", 7680),
    ],
)
def test_memory_is_rounded_up_to_whole_mib(value: str, mib: int) -> None:
    assert parse_memory_mib(value) == mib


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("", "memory-quantity"),
        (" 4Gi", "memory-quantity"),
        ("4Gi ", "memory-quantity"),
        ("4 Gi", "memory-quantity"),
        ("\t4Gi", "memory-quantity"),
        ("4GB", "memory-quantity"),
        ("4gi", "memory-quantity"),
        ("4K", "memory-quantity"),  # decimal kilo is lower-case k
        ("Gi", "memory-quantity"),
        (".", "memory-quantity"),
        ("1e", "memory-quantity"),
        ("1.2.3", "memory-quantity"),
        ("0x10", "memory-quantity"),
        ("1_000Mi", "memory-quantity"),
        ("NaN", "memory-quantity"),
        ("inf", "memory-quantity"),
        ("4096000000000m", "memory-quantity"),  # milli: a thousandth of a byte, refused
        ("512m", "memory-quantity"),
        ("1e40", "memory-quantity"),  # beyond int64 bytes
        ("9Ei", "memory-quantity"),
        ("1e999999999", "memory-quantity"),  # must answer at once, not build the number
        ("1" * 65, "memory-quantity"),
        ("0", "memory-minimum"),
        ("0Gi", "memory-minimum"),
        ("-1Gi", "memory-minimum"),
        ("-0", "memory-minimum"),
        ("4096", "memory-minimum"),  # bare small byte count: 4 KiB, not 4 GiB
        ("1048575", "memory-minimum"),
        ("1023Ki", "memory-minimum"),
        ("1e-999999", "memory-minimum"),
        ("0.9Mi", "memory-minimum"),
    ],
)
def test_malformed_memory_names_the_rule(value: str, rule: str) -> None:
    with pytest.raises(ContractError) as caught:
        parse_memory_mib(value)
    assert caught.value.rule == rule
    assert caught.value.message


def test_quantity_values_are_exact() -> None:
    assert parse_quantity("1000M") == 10**9
    assert parse_quantity("1.5Gi") == 3 * 2**29
    assert parse_quantity("1e-3") == Fraction(1, 1000)
    assert parse_quantity("-2Ki") == -2048
    assert parse_quantity("100m") == Fraction(1, 10)  # a quantity; only memory refuses milli


def test_non_string_is_malformed_not_a_crash() -> None:
    with pytest.raises(ContractError) as caught:
        parse_memory_mib(4096)  # type: ignore[arg-type]
    assert caught.value.rule == "memory-quantity"


def test_rendering_round_trips() -> None:
    assert format_mib(954) == "954Mi"
    assert parse_memory_mib(format_mib(954)) == 954
