"""Byte sizes for humans: GiB with two decimals in the terminal, never raw ints."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "ki": 1024, "mib": 1024**2,
          "mi": 1024**2, "gib": 1024**3, "gi": 1024**3, "tib": 1024**4, "ti": 1024**4}

GiB = 1024**3
MiB = 1024**2


def fmt_bytes(n: int | float | None) -> str:
    """1.23 GiB / 456.00 MiB / 12.0 KiB; negative values keep their sign."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    a = abs(float(n))
    if a >= GiB:
        return f"{sign}{a / GiB:.2f} GiB"
    if a >= MiB:
        return f"{sign}{a / MiB:.2f} MiB"
    if a >= 1024:
        return f"{sign}{a / 1024:.1f} KiB"
    return f"{sign}{int(a)} B"


def fmt_deltas(deltas: dict[str, int]) -> str:
    """Signed byte differences by name, e.g. "decode +0 B, stock -12.0 KiB" ("none": empty)."""
    return ", ".join(f"{k} {'+' if d >= 0 else '-'}{fmt_bytes(abs(d))}"
                     for k, d in deltas.items()) or "none"


def parse_size(text: str | int) -> int:
    """'4GiB', '512MiB', '1.5G', '1073741824' -> bytes. Raises ValueError with the accepted forms."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read size {text!r}: use bytes or a unit such as 512MiB, 4GiB, 8G")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def fmt_tokens(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n:,}"
