"""Checks shared by the typed parameters of group-scored eviction (frozen dataclasses):
a bad value is a ValueError naming the parameter and its range; an unknown name is a
``UnknownParameterError`` (a TypeError naming it)."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Iterable

from anchorage.policies.base import UnknownParameterError


def number(name: str, v: Any, lo: float, hi: float = math.inf, *,
           lo_open: bool = False) -> float:
    """``v`` as a float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``), else ValueError."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise ValueError(f"{name} must be a number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        rng = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        raise ValueError(f"{name} must be in {rng}, got {v!r}")
    return float(v)


def integer(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return v


def flag(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be true or false, got {v!r}")
    return v


def field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def reject_unknown(given: Iterable[str], accepted: Iterable[str]) -> None:
    """UnknownParameterError naming the first (sorted) name not in ``accepted``."""
    acc = set(accepted)
    unknown = sorted(set(given) - acc)
    if unknown:
        raise UnknownParameterError(unknown[0], sorted(acc))
