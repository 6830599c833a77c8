"""Checks shared by every config: a setting out of range is refused by its flag's name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def flag(name: str) -> str:
    """A setting's command-line flag (`batch_size` -> `--batch-size`)."""
    return f"--{name.replace('_', '-')}"


def require_positive(holder: Any, names: Iterable[str]) -> None:
    """ValueError naming the first of `names` on `holder` that is not > 0 (NaN included)."""
    for name in names:
        if not getattr(holder, name) > 0:
            raise ValueError(f"{flag(name)} must be positive, got {getattr(holder, name)}")


def require_non_negative(holder: Any, names: Iterable[str]) -> None:
    """ValueError naming the first of `names` on `holder` that is not >= 0 (NaN included)."""
    for name in names:
        if not getattr(holder, name) >= 0:
            raise ValueError(f"{flag(name)} must be >= 0, got {getattr(holder, name)}")
