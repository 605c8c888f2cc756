"""Tools of the calculator example."""

import stead


@stead.tool
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: the first addend
        b: the second addend
    """
    return _tidy(a + b)


@stead.tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: the first factor
        b: the second factor
    """
    return _tidy(a * b)


def _tidy(x: float) -> float:
    """Whole results print as 20, not 20.0."""
    return int(x) if float(x).is_integer() else x
