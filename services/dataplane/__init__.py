"""The data plane: what a task does with data, between the control plane's events.

* ``keygroups`` / ``spark_hash``: keys to key groups (Spark's Murmur3 hash, Flink's ranges),
  in a DataFrame column and in pure Python, with the same result.
* ``splits``: planning input splits (byte ranges of text/CSV, row groups of Parquet).
* ``reader``: reading one split into a DataFrame (Hadoop's line rule).
* ``exchange``: producers' output partitions (keyed by key group), consumers' inputs, sinks.
* ``fs``: Sluice's own file operations, on local paths, ``file://`` and ``s3://`` alike.
* ``spark_reach``: which locations Spark itself must reach (the storage root, sinks), and
  whether it can.

Pure Python plus PySpark; works with Spark Connect and classic sessions alike. No Redis.
"""

from __future__ import annotations

from sluice.services.dataplane.errors import DataplaneError, SchemaError, SplitError
from sluice.services.dataplane.exchange import KEY_GROUP_COLUMN, SCHEMA_FILE, read_inputs, write_partition, write_sink
from sluice.services.dataplane.keygroups import (
    key_group_column,
    key_group_of,
    key_group_range,
    operator_index_for_key_group,
)
from sluice.services.dataplane.reader import materialize_split, read_split
from sluice.services.dataplane.spark_hash import spark_hash
from sluice.services.dataplane.splits import Split, plan_splits

__all__ = [
    "KEY_GROUP_COLUMN",
    "SCHEMA_FILE",
    "DataplaneError",
    "SchemaError",
    "Split",
    "SplitError",
    "key_group_column",
    "key_group_of",
    "key_group_range",
    "materialize_split",
    "operator_index_for_key_group",
    "plan_splits",
    "read_inputs",
    "read_split",
    "spark_hash",
    "write_partition",
    "write_sink",
]
