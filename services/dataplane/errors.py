"""Errors of the data plane: bad arguments and inputs that a caller can fix (declared in
sluice/errors.py with every other error; named here for the data plane's callers)."""

from __future__ import annotations

from sluice.errors import DataplaneError, SchemaError, SplitError

__all__ = ["DataplaneError", "SchemaError", "SplitError"]
