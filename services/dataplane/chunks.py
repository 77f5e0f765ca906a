"""A source read ``each_split`` keeps each split's result as a chunk (a Parquet folder in
the task's temp dir) before it asks for the next split; this writes one.

Spark's writer runs a write job with its commit protocol (task attempts' folders, their
commit, ``_SUCCESS``): about 0.3 s a split on this machine kind, which a fast reader pays
once a split. A small split's result is instead collected as Arrow (the form Spark Connect
returns results in anyway) and written by this process with pyarrow (through ``fs``): 0.19 s against 0.31 s
in the profile of issue 11, the same rows read back by Spark with the result's schema.
That holds the result in the worker's memory, so it is done only when the split's rows
take at most ``ARROW_CHUNK_BYTES`` (``input_bytes``: a Parquet split's uncompressed size, a
text or CSV copy's size; unknown for a compressed copy) and every column's type survives
Arrow and Parquet as the same Spark type; otherwise Spark writes the chunk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice.services.dataplane import fs

__all__ = ["write_chunk", "arrow_writable", "input_bytes", "ARROW_CHUNK_BYTES"]

ARROW_CHUNK_BYTES = 4 << 20
"""A split whose rows take at most this much has its result collected and written by the
worker (a row-by-row function's result is of the same order; a function that multiplies
rows multiplies it too). Above it a Spark job a split is a small part of the work."""


def input_bytes(item: tuple[int, int] | Path) -> int | None:
    """About how much a taken split's rows take uncompressed: a range of numbers, or the
    split's copy (a Parquet file by its row groups' sizes); None when not known (a
    compressed text or CSV copy, or a file that cannot be read here)."""
    if isinstance(item, tuple):
        return 8 * (item[1] - item[0])
    if item.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            with fs.open_read(str(item)) as f:
                meta = pq.ParquetFile(f).metadata
            size: int = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))  # (pyarrow: untyped)
            return size
        except Exception:  # Spark reads it (and says what is wrong with it)
            return None
    if item.suffix in (".txt", ".csv"):
        found = fs.info(str(item))
        return None if found is None else found.size
    return None


def arrow_writable(schema: Any) -> bool:
    """Whether every column of a Spark schema reads back from an Arrow-written Parquet file
    as the same Spark type (numbers, decimals, strings, binary, booleans, dates,
    timestamps, and arrays, maps and structs of them, with names unique at each level)."""
    from pyspark.sql import types as T

    plain = (
        T.ByteType,
        T.ShortType,
        T.IntegerType,
        T.LongType,
        T.FloatType,
        T.DoubleType,
        T.DecimalType,
        T.StringType,
        T.BinaryType,
        T.BooleanType,
        T.DateType,
        T.TimestampType,
        T.TimestampNTZType,
    )

    def ok(t: Any) -> bool:
        if isinstance(t, (T.CharType, T.VarcharType)):
            return False  # read back as strings
        if isinstance(t, plain):
            return True
        if isinstance(t, T.ArrayType):
            return ok(t.elementType)
        if isinstance(t, T.MapType):
            return ok(t.keyType) and ok(t.valueType)
        if isinstance(t, T.StructType):
            names = [f.name for f in t.fields]
            return bool(names) and len(set(names)) == len(names) and all(ok(f.dataType) for f in t.fields)
        return False  # intervals, variants, user types, nulls: Spark writes them

    return ok(schema)


def write_chunk(df: Any, path: Path, size: int | None) -> Any:
    """Write one split's result to the folder ``path`` (replacing it); returns its schema.
    ``size``: the split's ``input_bytes``."""
    schema = df.schema
    if size is not None and size <= ARROW_CHUNK_BYTES and arrow_writable(schema):
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = df.toArrow()
        out = pa.BufferOutputStream()
        pq.write_table(table, out)
        fs.delete_tree(str(path))
        fs.write_bytes(fs.join(str(path), "part-00000.parquet"), out.getvalue().to_pybytes())
    else:
        df.write.mode("overwrite").parquet(str(path))
    return schema
