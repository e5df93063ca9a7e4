"""Kubernetes-style quantities: "80Gi", "512Mi", "1Ti", "1.5G", 96, "500m" (cpu)."""
from __future__ import annotations

import re

_BIN = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_DEC = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]{0,2})\s*$")


def parse_bytes(value: object) -> int:
    """Bytes from a number (taken as bytes) or a quantity string ("24Gi", "16G", "512Mi")."""
    if isinstance(value, bool):
        raise ValueError("must be a quantity such as 24Gi")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("must be >= 0")
        return int(value)
    if not isinstance(value, str):
        raise ValueError("must be a quantity such as 24Gi")
    m = _RE.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a quantity such as 24Gi")
    num, suffix = float(m.group(1)), m.group(2)
    if suffix == "":
        return int(num)
    if suffix in _BIN:
        return int(num * _BIN[suffix])
    if suffix in _DEC:
        return int(num * _DEC[suffix])
    raise ValueError(f"{value!r}: unknown unit {suffix!r} (use Ki, Mi, Gi, Ti or k, M, G, T)")


def parse_cpu(value: object) -> float:
    """Cores from a number or a string ("8", "500m")."""
    if isinstance(value, bool):
        raise ValueError("must be a number of cores")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("must be >= 0")
        return float(value)
    if isinstance(value, str):
        s = value.strip()
        try:
            return float(s[:-1]) / 1000 if s.endswith("m") else float(s)
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a number of cores such as 8 or 500m")


def format_bytes(n: float) -> str:
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{int(n)}"


def format_amount(resource: str, amount: float) -> str:
    """'4 GPUs', '0.5 GPU', '16 cores', '64Gi'."""
    if resource == "gpu":
        v = f"{amount:g}"
        return f"{v} GPU" if 0 < amount <= 1 else f"{v} GPUs"
    if resource == "cpu":
        return f"{amount:g} cores"
    return format_bytes(amount)
