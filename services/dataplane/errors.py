"""Errors of the data plane: bad arguments and inputs that a caller can fix.

They subclass both ``SluiceError`` (so Sluice's handlers catch them with the rest) and
``ValueError`` (so plain Python callers can treat them as the bad values they are).
Every message names what was wrong and what to do about it.
"""

from __future__ import annotations

from sluice.errors import SluiceError

__all__ = ["DataplaneError", "SchemaError", "SplitError"]


class DataplaneError(SluiceError, ValueError):
    """An argument or input of the data plane is wrong; the message says how to fix it."""


class SplitError(DataplaneError):
    """Input splits cannot be planned or read (missing paths, unsupported formats or schemes)."""


class SchemaError(DataplaneError):
    """A DataFrame or an exchange directory lacks a column or schema the operation needs."""
