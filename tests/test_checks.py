"""adaptcq.checks: a bool is neither a whole number nor a real number."""

import math
from fractions import Fraction

import numpy as np
import pytest

from adaptcq.checks import is_finite, is_int, is_real


@pytest.mark.parametrize("x", [0, 1, -7, 10**30])
def test_ints(x):
    assert is_int(x) and is_real(x) and is_finite(x)


@pytest.mark.parametrize("x", [True, False, np.bool_(True)])
def test_bools_are_no_numbers(x):
    assert not is_int(x) and not is_real(x) and not is_finite(x)


@pytest.mark.parametrize("x", [1.0, np.int64(3), np.float32(0.5), Fraction(1, 3)])
def test_reals_that_are_not_python_ints(x):
    assert not is_int(x) and is_real(x) and is_finite(x)


@pytest.mark.parametrize("x", [math.nan, math.inf, -math.inf])
def test_not_finite(x):
    assert is_real(x) and not is_finite(x)


@pytest.mark.parametrize("x", ["1", None, 1j, [1]])
def test_others(x):
    assert not is_int(x) and not is_real(x) and not is_finite(x)
