"""``training.memory_budget``: a size (``6GiB``, ``512MiB``) that bounds a run's peak memory, and sizes as text."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")


def size_bytes(text: str) -> int:
    """``6GiB``, ``512MiB``, ``1.5GB`` in bytes.

    Raises:
        ValueError: not a positive number followed by a unit.
    """
    match = _SIZE.match(text)
    if match is None or match.group(2) not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"must be a size such as 6GiB or 512MiB (units: {', '.join(_UNITS)})")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def mib(value: float) -> str:
    """Bytes as MiB, to a kibibyte."""
    return f"{value / 2**20:,.3f} MiB"


def _checked(value: Any) -> Any:
    if value is not None:
        size_bytes(value if isinstance(value, str) else "")
    return value


MemoryBudget = Annotated[str | None, BeforeValidator(_checked)]
"""A size as text, checked when read, or None (no budget)."""
