"""Exchanging data between tasks: a producer writes its output partition, consumers read theirs.

A producer subtask writes its output as Parquet under its own path. Keyed output is
partitioned by key group (a ``_kg=N`` directory per group, ``keygroups.key_group_column``),
so a consumer subtask reads only the ``_kg=N`` directories of its key-group range from
every producer's path: the shuffle of a keyed exchange is a directory listing. Next to the data the producer leaves ``_schema.json`` (its DataFrame's schema):
a consumer reads the data with it when every producer it reads recorded the same one (Spark
then runs no job to infer it), and a consumer of producers that all produced nothing still
knows the columns.
Sinks write one flat directory; each attempt of a sink subtask stages its files apart and publishes
them by the protocol of ``publish``, so the newest attempt of each subtask wins.

Paths must be absolute (or URIs): the Spark Connect server resolves relative paths
against its own working directory. ``_schema.json`` is written and read through ``fs`` (pyarrow's
file systems) from this process, so the Spark server and this process must see the same
storage (a local disk on the TaskManager's machine, or a URI both can reach).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from sluice.errors import StorageError
from sluice.services.dataplane import fs, publish
from sluice.services.dataplane.errors import DataplaneError, SchemaError
from sluice.services.dataplane.keygroups import key_group_column

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "KEY_GROUP_COLUMN",
    "SCHEMA_FILE",
    "SINK_FORMATS",
    "published_bytes",
    "read_inputs",
    "sweep_sink",
    "write_partition",
    "write_sink",
]

KEY_GROUP_COLUMN = "_kg"
"""The partition column of keyed output: the row's key group."""

SCHEMA_FILE = "_schema.json"
"""Written next to a producer's data: ``df.schema.json()`` of what it wrote (without ``_kg``)."""

SINK_FORMATS = ("parquet", "csv")


def _check_path(path: str, what: str) -> str:
    if not isinstance(path, str) or not path:
        raise DataplaneError(f"{what} must be a non-empty path string, got {path!r}")
    if len(urlparse(path).scheme) <= 1 and not os.path.isabs(path):
        raise DataplaneError(
            f"{what} {path!r} is relative: use an absolute path or a URI (the Spark Connect server "
            "resolves relative paths against its own working directory)"
        )
    return path.rstrip("/") or "/"


def _quoted(name: str) -> str:
    """A top-level column name as a Spark column reference (dots and backticks taken literally)."""
    return "`" + name.replace("`", "``") + "`"


def write_partition(
    df: DataFrame,
    path: str,
    *,
    key: str | None,
    max_parallelism: int,
    consumers: int | None = None,
    partitions: int | None = None,
) -> None:
    """Write a producer subtask's output to ``path`` as Parquet, replacing what was there.

    Without ``key`` the DataFrame is written as is. With ``key`` every row gets its key
    group ``_kg`` and the output is partitioned by it, one file per key group: a shuffle
    by ``_kg`` first, so the number of files does not grow with the DataFrame's
    partitions; but a task whose share is one partition (``partitions=1``,
    ``taskmanager.share``) writes its one partition without a shuffle. ``_schema.json``
    is written last, next to the data.
    """
    path = _check_path(path, "output path")
    schema = df.schema
    columns = schema.fieldNames()
    if key is None:
        df.write.mode("overwrite").parquet(path)
    else:
        if key not in columns:
            raise SchemaError(
                f"key column {key!r} is not in the DataFrame; its columns are: {', '.join(columns) or '(none)'}. "
                "Key by one of them, or add the column before writing"
            )
        if KEY_GROUP_COLUMN in columns:
            raise SchemaError(
                f"the DataFrame has a column {KEY_GROUP_COLUMN!r}, which keyed output reserves for the key group: rename it"
            )
        kg = key_group_column(_quoted(key), max_parallelism)
        if consumers is not None:
            # One directory per consumer, not per key group: rows go to the first key group
            # of their owner's range (Flink's contiguous ranges), so a producer writes
            # ``consumers`` files instead of ``max_parallelism`` (a file costs ~20 ms here)
            # and read_inputs, which reads the directories within a consumer's range, finds
            # exactly its rows.
            from pyspark.sql import functions as F

            if not 1 <= consumers <= max_parallelism:
                raise DataplaneError(
                    f"consumers must be between 1 and max_parallelism {max_parallelism}, got {consumers}"
                )
            owner = F.floor(kg * F.lit(consumers) / F.lit(max_parallelism))
            kg = F.floor((owner * F.lit(max_parallelism) + F.lit(consumers - 1)) / F.lit(consumers)).cast("int")
        keyed = df.withColumn(KEY_GROUP_COLUMN, kg)
        # A task of one partition (taskmanager.share) writes it as it is: one file per
        # directory, no shuffle. Others shuffle by _kg (into the task's share of partitions)
        # so that each directory is one file, whatever the DataFrame's partitions.
        keyed = keyed.coalesce(1) if partitions == 1 else keyed.repartition(KEY_GROUP_COLUMN)
        (
            keyed.write.mode("overwrite")
            .option("partitionOverwriteMode", "static")  # replace the whole output, even if the session says dynamic
            .partitionBy(KEY_GROUP_COLUMN)
            .parquet(path)
        )
    fs.write_bytes(fs.join(path, SCHEMA_FILE), schema.json().encode("utf-8"))


class _Listing:
    """What one producer path holds: data files at its root (unkeyed) and ``_kg=N`` directories with data."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.unkeyed = False
        self.key_groups: dict[int, str] = {}
        info = _published(path)
        if info.is_file:
            self.unkeyed = True
            return
        prefix = f"{KEY_GROUP_COLUMN}="
        for entry in fs.listdir(path, recursive=True):
            if not entry.is_file or entry.name.startswith(("_", ".")):
                continue  # _SUCCESS, _schema.json, .crc files
            parts = entry.uri[len(info.uri) :].strip("/").split("/")
            if len(parts) == 2 and parts[0].startswith(prefix) and parts[0][len(prefix) :].isdigit():
                self.key_groups[int(parts[0][len(prefix) :])] = f"{path}/{parts[0]}"
            else:
                self.unkeyed = True

    @property
    def empty(self) -> bool:
        return not self.unkeyed and not self.key_groups


def _published(path: str) -> fs.Entry:
    """What the file system says of a producer's output ``path`` (DataplaneError if there is none)."""
    info = fs.info(path)
    if info is None:
        raise DataplaneError(
            f"input path {path!r} does not exist: its producer has not written its output there "
            "(did the producer finish, and write to this path?)"
        )
    return info


def published_bytes(path: str) -> int:
    """The bytes of data a producer published at ``path`` (its data files, keyed or not;
    not ``_schema.json``, ``_SUCCESS`` or checksums). DataplaneError if it wrote nothing there."""
    path = _check_path(path, "input path")
    info = _published(path)
    if info.is_file:
        return info.size or 0
    return sum(
        entry.size or 0
        for entry in fs.listdir(path, recursive=True)
        if entry.is_file and not entry.name.startswith(("_", ".")) and not entry.name.endswith(".crc")
    )


def _schema_of(path: str) -> StructType | None:
    """The schema ``path``'s producer recorded in ``_schema.json`` (None: it left none)."""
    from pyspark.sql.types import StructType

    name = fs.join(path, SCHEMA_FILE)
    info = fs.info(name)
    if info is None or not info.is_file:
        return None
    return StructType.fromJson(json.loads(fs.read_bytes(name).decode("utf-8")))


def _written_schema(paths: list[str]) -> StructType | None:
    """The first schema recorded among ``paths`` (for when none of them has data)."""
    return next((schema for path in paths if (schema := _schema_of(path)) is not None), None)


def _agreed_schema(paths: list[str]) -> StructType | None:
    """The schema every one of ``paths`` recorded, if they all did and all agree, else None
    (Spark then reads it from the files, as it must when producers' columns differ: a
    given schema would fill missing columns with nulls and drop extra ones)."""
    try:
        schemas = [_schema_of(path) for path in paths]
    except Exception:  # an unreadable record (or a type it names that cannot be imported here): the files say
        return None
    first = schemas[0] if schemas else None
    return first if first is not None and all(s == first for s in schemas) else None


def _check_key_groups(key_groups: object) -> tuple[int, int]:
    if (
        not isinstance(key_groups, (tuple, list))
        or len(key_groups) != 2
        or not all(isinstance(k, int) and not isinstance(k, bool) for k in key_groups)
        or not 0 <= key_groups[0] <= key_groups[1]
    ):
        raise DataplaneError(
            f"key_groups must be (first, last), inclusive ints with 0 <= first <= last (see key_group_range), "
            f"got {key_groups!r}"
        )
    return key_groups[0], key_groups[1]


def read_inputs(
    spark: SparkSession,
    paths: list[str],
    *,
    key_groups: tuple[int, int] | None,
    schema_hint: StructType | str | None = None,
) -> DataFrame:
    """The union of producers' outputs at ``paths``; with ``key_groups`` only rows of those groups.

    ``key_groups`` is an inclusive range ``(first, last)`` (``keygroups.key_group_range``);
    it needs keyed inputs. The result never has the ``_kg`` column. The columns are those
    the producers of the rows read all recorded in ``_schema.json`` (if they differ, or one
    recorded none, Spark reads them from the files). Producers that produced nothing are skipped; when none produced anything the result is an empty
    DataFrame with the schema they recorded in ``_schema.json``, else ``schema_hint``
    (a StructType or a DDL string).
    """
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)):
        raise DataplaneError(f"paths must be a list of producer output paths, got {paths!r}")
    checked = [_check_path(p, "input path") for p in paths]
    groups = None if key_groups is None else _check_key_groups(key_groups)
    listings = [_Listing(p) for p in checked]
    keyed = [item for item in listings if item.key_groups]
    unkeyed = [item.path for item in listings if item.unkeyed]
    if keyed and unkeyed:
        raise SchemaError(
            f"inputs mix keyed output ({keyed[0].path!r}) and unkeyed output ({unkeyed[0]!r}): "
            "all producers of one exchange must write with the same key"
        )
    if unkeyed and groups is not None:
        raise SchemaError(
            f"key_groups {groups} given but the inputs {unkeyed!r} were not written with a key "
            f"(no {KEY_GROUP_COLUMN}=N directories): write them with write_partition(..., key=...)"
        )
    # Keyed: read the wanted key groups' directories themselves (pruning by listing; no
    # partition discovery, which refuses several root directories).
    wanted = [
        (
            item.path,
            [leaf for kg, leaf in sorted(item.key_groups.items()) if groups is None or groups[0] <= kg <= groups[1]],
        )
        for item in keyed
    ]
    leaves = unkeyed or [leaf for _, item_leaves in wanted for leaf in item_leaves]
    if leaves:
        # With the schema the producers of the data read recorded, Spark does not run a job
        # to read a file's footer for it (about 80 ms of a reducer's ~0.9 s at 450,000 keys).
        agreed = _agreed_schema(unkeyed or [path for path, item_leaves in wanted if item_leaves])
        return (spark.read if agreed is None else spark.read.schema(agreed)).parquet(*leaves)
    schema = _written_schema(checked) or schema_hint
    if schema is None:
        raise SchemaError(
            f"none of the inputs {list(paths)!r} has data for key groups {groups} or a {SCHEMA_FILE}, so their "
            "columns are unknown: write them with write_partition, or pass schema_hint"
        )
    return spark.createDataFrame([], schema)


def write_sink(
    df: DataFrame, path: str, subtask: int, attempt: int, format: str, options: dict[str, str] | None = None
) -> publish.Outcome:
    """Write attempt ``attempt`` of a sink subtask as files ``{path}/part-{subtask:05d}-a{attempt:06d}-NNN.{ext}``.

    The directory stays one flat dataset that any reader takes whole (``spark.read.parquet(path)``).
    Spark writes into the attempt's own hidden staging directory first; then the files are
    published by the protocol of ``publish``: the newest attempt of the subtask wins, and an
    older attempt (one on a TaskManager declared lost, finishing late) never replaces a newer
    one's files, even when both publish at the same time. Returns how publishing ended
    (``PUBLISHED``, or ``SUPERSEDED``/``WITHDRAWN`` when a newer attempt won).
    """
    path = _check_path(path, "sink path")
    for what, value in (("subtask", subtask), ("attempt", attempt)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DataplaneError(f"{what} must be an int >= 0 (the sink {what}'s number), got {value!r}")
    if format not in SINK_FORMATS:
        raise DataplaneError(f"unknown sink format {format!r}: use one of {', '.join(SINK_FORMATS)}")
    opts = {k: str(v) for k, v in (options or {}).items()}
    staging = publish.staging_name(subtask, attempt)
    df.write.mode("overwrite").format(format).options(**opts).save(f"{path}/{staging}")
    try:
        return _publish(path, staging, subtask, attempt, format)
    finally:
        with contextlib.suppress(OSError, StorageError):  # private and hidden: a leftover harms no reader
            fs.delete_tree(fs.join(path, staging))


def sweep_sink(path: str, subtask: int, abandoned: int | None = None) -> int:
    """Delete the files of ``subtask``'s attempts older than its newest published one
    (``publish.superseded``), and those of attempt ``abandoned`` if it never published
    (``publish.abandoned``: an attempt the leader cancelled); returns how many went. Safe at
    any time; a TaskManager runs it after killing an attempt that may have died halfway
    through publishing."""
    path = _check_path(path, "sink path")
    try:
        listing = _names(path)
    except FileNotFoundError:
        return 0
    gone = publish.superseded(listing, subtask)
    if abandoned is not None:
        gone = (*gone, *(n for n in publish.abandoned(listing, subtask, abandoned) if n not in gone))
    for name in gone:
        fs.delete_file(fs.join(path, name))
    return len(gone)


_SPARK_PART = re.compile(r"part-.*-c\d+\.(.+)")
"""Spark's name of a written file (``part-00000-<uuid>-c000.snappy.parquet``): group 1 is its extension."""


def _publish(path: str, staging: str, subtask: int, attempt: int, format: str) -> publish.Outcome:
    """The shell of ``publish.Publication``: list, move and delete as it says."""
    staged = [
        entry
        for entry in fs.listdir(fs.join(path, staging))
        if entry.is_file and not entry.name.startswith(("_", ".")) and not entry.name.endswith(".crc")
    ]
    staged.sort(key=lambda entry: entry.name)
    # Keep what the extension says about compression (csv.gz): readers decompress by it.
    exts = [m[1] if (m := _SPARK_PART.fullmatch(entry.name)) else format for entry in staged]
    pub = publish.Publication.start(subtask, attempt, exts)
    sources = {name: entry.uri for name, entry in zip(pub.names, staged)}  # the marker has none: created empty
    try:
        while not pub.done:
            listing = _names(path) if pub.needs_listing else None
            pub, action = pub.advance(listing)
            for name in action.move:
                if name in sources:
                    fs.move(sources[name], fs.join(path, name))
                else:
                    fs.write_bytes(fs.join(path, name), b"")
            for name in action.delete:
                fs.delete_file(fs.join(path, name))
    except BaseException:
        # A failed attempt takes back what it moved in (marker first): its task fails, and
        # a newer attempt or its restart publishes the subtask.
        for name in reversed(pub.names):
            with contextlib.suppress(OSError, StorageError):  # the first error is the one to report
                fs.delete_file(fs.join(path, name))
        raise
    assert pub.outcome is not None
    return pub.outcome


def _names(path: str) -> list[str]:
    """One listing of a sink directory: the base names of what is in it."""
    return [entry.name for entry in fs.listdir(path)]
