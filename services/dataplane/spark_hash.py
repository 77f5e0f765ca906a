"""Spark's ``hash()`` (Murmur3 x86_32, seed 42) in pure Python.

Why: a client (or the JobManager) must route a key to its key group without a Spark
session, and get exactly the group Spark computes for the same key in a DataFrame.

Spark's ``Murmur3_x86_32`` is *not* the reference MurmurHash3 (``mmh3``) for byte strings:
``hashUnsafeBytes`` mixes the aligned 4-byte words as usual (little-endian), but then mixes
*each* tail byte on its own, sign-extended to an int, through the full ``mixK1``/``mixH1``
round (the reference packs the 1–3 tail bytes into one word and skips ``mixH1``). Strings
whose UTF-8 length is a multiple of 4 therefore hash like ``mmh3.hash(b, 42)``; others don't.

Spark type of each Python value (the one ``spark.createDataFrame`` infers):

=============  ===========  ==================================================
Python         Spark type   Spark hashes
=============  ===========  ==================================================
``None``       any          nothing: the result is the seed (42)
``bool``       BooleanType  ``hashInt(1 or 0)``
``int``        LongType     ``hashLong``: low 32 bits, then high 32 bits
``float``      DoubleType   ``hashLong(doubleToLongBits(x))``, -0.0 as 0.0
``str``        StringType   ``hashUnsafeBytes`` of the UTF-8 bytes
=============  ===========  ==================================================

A column typed IntegerType (int32) hashes with ``hashInt`` and gives other values than
the same numbers as LongType: keep key columns strings or longs (see ``hash_int``).
"""

from __future__ import annotations

import math
import struct

__all__ = ["SPARK_HASH_SEED", "hash_bytes", "hash_int", "hash_long", "spark_hash"]

SPARK_HASH_SEED = 42
"""The seed of Spark's ``hash()`` function (``Murmur3Hash`` expression)."""

_MASK = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_CANONICAL_NAN = 0x7FF8000000000000


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _MASK
    k1 = _rotl(k1, 15)
    return (k1 * _C2) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length & _MASK
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1


def _signed(x: int) -> int:
    return x - (1 << 32) if x & 0x80000000 else x


def hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hashInt``: the hash of an IntegerType (or BooleanType as 0/1) value."""
    if not -(1 << 31) <= value < (1 << 31):
        raise OverflowError(f"{value} does not fit a 32-bit int (Spark IntegerType)")
    return _signed(_fmix(_mix_h1(seed & _MASK, _mix_k1(value & _MASK)), 4))


def hash_long(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hashLong``: the hash of a LongType value (low word first, then high word)."""
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise OverflowError(f"{value} does not fit a 64-bit long (Spark LongType)")
    bits = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _MASK, _mix_k1(bits & _MASK))
    h1 = _mix_h1(h1, _mix_k1(bits >> 32))
    return _signed(_fmix(h1, 8))


def hash_bytes(data: bytes, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hashUnsafeBytes`` (how StringType and BinaryType values are hashed)."""
    n = len(data)
    aligned = n - n % 4
    h1 = seed & _MASK
    for word in struct.unpack_from(f"<{aligned // 4}I", data):
        h1 = _mix_h1(h1, _mix_k1(word))
    for b in data[aligned:]:
        # Platform.getByte: a signed byte, sign-extended to an int, mixed on its own.
        h1 = _mix_h1(h1, _mix_k1((b | 0xFFFFFF00) if b & 0x80 else b))
    return _signed(_fmix(h1, n))


def spark_hash(value: str | int | bool | float | None, seed: int = SPARK_HASH_SEED) -> int:  # noqa: PYI041
    """``hash(value)`` as Spark computes it for the type in the module's table (a signed int32)."""
    if value is None:
        return _signed(seed & _MASK)
    if isinstance(value, bool):
        return hash_int(int(value), seed)
    if isinstance(value, int):
        return hash_long(value, seed)
    if isinstance(value, float):
        if math.isnan(value):
            return hash_long(_CANONICAL_NAN, seed)  # doubleToLongBits folds every NaN into one
        value = 0.0 if value == 0.0 else value  # Spark normalizes -0.0 before hashing
        (bits,) = struct.unpack("<q", struct.pack("<d", value))
        return hash_long(bits, seed)
    if isinstance(value, str):
        return hash_bytes(value.encode("utf-8"), seed)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return hash_bytes(bytes(value), seed)
    raise TypeError(
        f"cannot hash a {type(value).__name__} like Spark: keys must be str, int, bool, float or None "
        "(strings or longs recommended)"
    )
