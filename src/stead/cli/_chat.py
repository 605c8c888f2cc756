"""placeholder"""


def chat() -> None:
    """Chat."""
