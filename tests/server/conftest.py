"""Fixtures of the HTTP service tests (defined in `tests.server.support`)."""

from tests.server.support import env, make_env

__all__ = ["env", "make_env"]
