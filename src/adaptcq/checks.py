"""Whether an option's value is a whole number or a real number; ``True`` is neither.

Python's bool is a subclass of int, so ``isinstance(True, int)`` holds and an option given
``True`` (or ``False``) would silently mean 1 (or 0). Option checks ask these instead, and
keep their own messages, which name the option as the user writes it.

``whole`` also takes NumPy's integers (a count computed from data), as ``is_real`` takes
NumPy's floats, and gives the Python int: an option checked with it is used as that int.
``is_int`` stays Python's int only: its callers pass the value on as it is, to consumers
that refuse or mishandle NumPy's integers (``random.Random`` refuses ``np.int64`` as a seed;
``1 << np.int64(70)`` overflows to 0).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["is_finite", "is_int", "is_real", "whole"]


def is_int(x) -> bool:
    """A Python int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def whole(x) -> int | None:
    """``x`` as a Python int when it is a whole number (``numbers.Integral``: int, NumPy's
    integers; not a bool, nor NumPy's bool), else None. A float, even 3.0, is not one."""
    if isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)):
        return int(x)
    return None


def is_real(x) -> bool:
    """A real number (``numbers.Real``: int, float, NumPy's) that is not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_finite(x) -> bool:
    """A real number that is not a bool, NaN or infinite.

    A rational (int, Fraction, NumPy's ints) is always finite: ``math.isfinite`` converts
    to float first and raised OverflowError for one beyond float's range (``10**400``).
    """
    if not is_real(x):
        return False
    if isinstance(x, numbers.Rational):
        return True
    return math.isfinite(x)
