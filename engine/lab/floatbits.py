"""The bits of a floating-point number: sign, exponent, mantissa, in FP32, BF16 and FP16.

    bits = float_bits(0.0371, "bf16")     # FloatBits(sign='0', exponent='01111010', mantissa='0011000', ...)
    fmt = format_range("fp16")            # largest value, smallest normal, step after 1.0

value = (-1)^sign x 2^(exponent - bias) x 1.mantissa (for normal numbers). BF16 keeps FP32's 8 exponent bits
(same range, ~3.4e38) and 7 of its 23 mantissa bits (a step of 1/128 after 1.0); FP16 spends 5 bits on the
exponent (largest value 65,504) and 10 on the mantissa (a step of 1/1024).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import InvalidRequestError

FORMATS: dict[str, tuple[torch.dtype, int, int, torch.dtype]] = {
    # name: (dtype, exponent bits, mantissa bits, integer type of the same width)
    "fp32": (torch.float32, 8, 23, torch.int32),
    "bf16": (torch.bfloat16, 8, 7, torch.int16),
    "fp16": (torch.float16, 5, 10, torch.int16),
}


@dataclass(frozen=True)
class FloatBits:
    """One value stored in one format."""

    fmt: str
    original: float              # the value asked for (float64)
    stored: float                # what the format holds after rounding to nearest
    sign: str                    # '0' or '1'
    exponent: str                # exponent bits, most significant first
    mantissa: str                # fraction bits
    bias: int                    # 2^(exponent bits - 1) - 1

    @property
    def bits(self) -> str:
        return self.sign + self.exponent + self.mantissa

    @property
    def hex(self) -> str:
        return f"0x{int(self.bits, 2):0{len(self.bits) // 4}X}"

    @property
    def power(self) -> int:
        """The unbiased exponent of a normal number (subnormals use 1 - bias)."""
        e = int(self.exponent, 2)
        return (e if e else 1) - self.bias

    @property
    def relative_error(self) -> float:
        return abs(self.stored - self.original) / abs(self.original) if self.original else 0.0


def _check(fmt: str) -> tuple[torch.dtype, int, int, torch.dtype]:
    if fmt not in FORMATS:
        raise InvalidRequestError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


def float_bits(value: float, fmt: str) -> FloatBits:
    """Round `value` to the format (nearest, ties to even, as torch casts) and split its bit pattern."""
    dtype, exp_bits, man_bits, int_type = _check(fmt)
    stored = torch.tensor(value, dtype=torch.float64).to(dtype)
    raw = int(stored.view(int_type)) & ((1 << (1 + exp_bits + man_bits)) - 1)      # two's complement -> unsigned
    bits = format(raw, f"0{1 + exp_bits + man_bits}b")
    return FloatBits(fmt, float(value), float(stored.double()), bits[0], bits[1:1 + exp_bits],
                     bits[1 + exp_bits:], 2 ** (exp_bits - 1) - 1)


@dataclass(frozen=True)
class FormatRange:
    """Range against precision of one format."""

    fmt: str
    exponent_bits: int
    mantissa_bits: int
    largest: float
    smallest_normal: float
    step_after_one: float        # machine epsilon: the gap between 1.0 and the next value


def format_range(fmt: str) -> FormatRange:
    dtype, exp_bits, man_bits, _ = _check(fmt)
    info = torch.finfo(dtype)
    return FormatRange(fmt, exp_bits, man_bits, float(info.max), float(info.tiny), float(info.eps))
